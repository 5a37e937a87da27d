"""What the proxy reads off an HTTP request before anything else looks at it: the key, the
body (within its size limit), the body as JSON (within the nesting limit), the paging
query. Everything refused here is a request error the caller can fix. And how any error
becomes an answer in the caller's own shape."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive

from harnessrl.errors import HarnessRLError, InvalidRequest, TooLarge
from harnessrl.proxy.dialects.base import Dialect
from harnessrl.proxy.wire import codings, nesting
from harnessrl.types import EngineEvent

log = logging.getLogger("harnessrl.proxy.app")

_KEY_HEADERS = ("x-api-key", "x-goog-api-key")
# The count of earlier attempts the official openai and anthropic SDKs (Stainless-built)
# send with each call; google-genai retries without saying so.
RETRY_HEADERS = ("x-stainless-retry-count",)
_MAX_RETRY_COUNT = 2**31 - 1
# The largest page of turns one `GET /rollouts/<key>` returns: a turn holds its raw request
# and response, so a page is held in memory whole.
MAX_PAGE = 1000
_MAX_OFFSET = 2**63 - 1  # SQLite's integer range


def bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def request_key(request: Request) -> str | None:
    """The rollout key: from the path, else from whichever API-key header the client uses."""
    return request.path_params.get("key") or credential(request)


def credential(request: Request) -> str | None:
    """What the client presented as its API key (never the path)."""
    for header in _KEY_HEADERS:
        if value := request.headers.get(header):
            return value
    return bearer(request) or request.query_params.get("key")


async def read_body(request: Request, limit: int) -> bytes:
    """The request's whole body within `limit` (TooLarge past it); starlette's
    ClientDisconnect if the client left before it finished sending."""
    body = await receive_body(request.receive, limit, request.headers.get("content-length"))
    if body is None:
        raise ClientDisconnect
    return body


async def read_decoded(request: Request, limit: int) -> bytes:
    """`read_body` with its content codings undone (`proxy.wire.codings`), within `limit`
    decoded too."""
    raw = await read_body(request, limit)
    return codings.undo(raw, request.headers.get("content-encoding"), limit)


@dataclass(frozen=True, slots=True)
class Wire:
    """A model call's request as received: its body's bytes (coded, as they came), their
    Content-Encoding, and the client's retry count."""

    raw: bytes
    coding: str | None
    retry_count: int | None

    @staticmethod
    def of(request: Request, raw: bytes) -> Wire:
        return Wire(raw, request.headers.get("content-encoding"), retry_count(request))

    async def decoded(self, limit: int) -> bytes:
        """The body with its codings undone, within `limit`: off the event loop, since
        decoding up to the limit takes tens of milliseconds (a bomb refused at 32 MiB:
        50-100 ms here)."""
        if self.coding is None:
            return self.raw
        return await asyncio.to_thread(codings.undo, self.raw, self.coding, limit)


def retry_count(request: Request) -> int | None:
    """The client's count of earlier attempts at this call; None when it sends none (or
    one that is not a count: it is the client's note, never a reason to refuse)."""
    for header in RETRY_HEADERS:
        value = request.headers.get(header, "").strip()
        if value.isascii() and value.isdigit() and int(value) <= _MAX_RETRY_COUNT:
            return int(value)
    return None


async def receive_body(receive: Receive, limit: int, declared: str | None = None) -> bytes | None:
    """The whole body off an ASGI `receive` (the app's routes and the workers' relay both
    read it here); None if the client left before it finished sending. Past `limit` it is
    TooLarge, refused before any of it is read when its `declared` Content-Length says so."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the body has {int(declared)} bytes; this proxy accepts at most {limit}")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"the body is larger than this proxy's limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def decode_json(raw: bytes) -> Any:
    if not raw:
        raise InvalidRequest("the body is empty; send a JSON object")
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise nesting.too_deep_error("the body") from exc
    nesting.check_body(body, raw)
    return body


def page(request: Request) -> tuple[int, int]:
    """`?offset=&limit=` as (offset, limit), each within the range the store can page by."""
    return (_query_int(request, "offset", 0, 0, _MAX_OFFSET),
            _query_int(request, "limit", 100, 0, MAX_PAGE))


def _query_int(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise InvalidRequest(f"`{name}` must be an integer from {low} to {high}, got "
                             f"{raw[:40]!r}", param=name)
    return value


def as_error(exc: Exception) -> HarnessRLError:
    if isinstance(exc, HarnessRLError):
        return exc
    log.exception("unexpected error in the proxy")
    return HarnessRLError(f"internal proxy error ({type(exc).__name__}: {exc})")


def error_response(dialect: Dialect, err: HarnessRLError) -> Response:
    status, body = dialect.render_error(err)
    return Response(body, status_code=status, media_type="application/json")


# Between workers (`serve --workers N`): a relay marks the calls it passes on, and the owner
# names the turn of each model call's answer to a relay, so the relay can tell the store
# when its own client left before the answer's last byte (proxy/relay.py).
RELAYED = b"x-harnessrl-relayed"
TURN = b"x-harnessrl-turn"


def client_gone(receive: Any) -> bool:
    """Whether the client has disconnected, looked at now, without waiting: the server's
    next message is taken only if it is already there. The body has been read, so it can
    only be the disconnect. uvicorn answers at once once the connection is lost; a server
    that cannot say without waiting counts as the client still being there."""
    waiting = receive()
    try:
        waiting.send(None)
    except StopIteration as done:
        return done.value.get("type") == "http.disconnect"
    waiting.close()  # it would have waited: nothing has happened yet
    return False


class WholeReply(Response):
    """A model call's whole answer, its turn committed ok. The client is looked at just
    before the answer is handed to the server, in the same step of the event loop as the
    writes (uvicorn writes head and body at once, nothing in between waits): gone, nothing
    is sent and the turn becomes cancelled (`undelivered`). Once handed over it counts as
    delivered: what a client does with bytes in its socket no server can see."""

    def __init__(self, body: bytes, headers: dict[str, str],
                 undelivered: Callable[[], Awaitable[None]]) -> None:
        super().__init__(body, media_type="application/json", headers=headers)
        self.undelivered = undelivered

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if client_gone(receive):
            await self.undelivered()
            return
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body})


async def unless_disconnected(request: Request,
                               work: Awaitable[list[EngineEvent]]) -> list[EngineEvent] | None:
    """`work`'s result, or None (with `work` cancelled) when the client disconnects first."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(request.receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()  # the client left, or we are being cancelled ourselves
    return task.result() if task.done() and not task.cancelled() else None


async def _disconnect(receive: Any) -> None:
    # The body is already read, so the server's next message is the disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass
