"""The HTTP client every remote engine (vLLM chat and token mode, a teacher) calls its
endpoint with: JSON gets and posts, a model call's answer whole or as SSE, and the
endpoint's failures as our errors (transport, timeouts, HTTP statuses).

Two limits on waiting: `read_timeout` (the generation limit) bounds any silence once the
engine answers; `first_byte_timeout` bounds how long a model call may stay silent before
it begins to answer without the engine being asked whether it is alive (`GET /health`).
A streamed answer begins at once, so a silent engine is one that is stuck or gone. A
non-streamed answer begins only when it is done, so there the check keeps a long
generation going, and ends a call to an engine that no longer answers anything, within
`first_byte_timeout` + `PROBE_MAX` seconds instead of the generation limit.

`stream_interval` paces a streamed answer's reads (`Response.pace`): the first token is
passed on at once, later ones at most once per interval, so an engine that streams one
token every few milliseconds costs one socket read, parse and write per interval instead
of per token. It is a trade of CPU for latency (the last token may wait up to one
interval); 0, the default, passes every piece on as it arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import Any, TypeVar, cast

import msgspec

from harnessrl.errors import EngineError, EngineTimeout, EngineUnavailable, InvalidRequest
from harnessrl.http.client import Client, Response, TransportError, split
from harnessrl.proxy.wire.sse import SSEDecoder

FIRST_BYTE_TIMEOUT = 30.0
_Data = TypeVar("_Data", str, bytes | str)
PROBE_MAX = 10.0  # a health check slower than this counts as no answer
_decode = msgspec.json.decode


class Upstream:
    """One engine endpoint at `base_url` (its root: every call names its full URL)."""

    def __init__(self, base_url: str, *, read_timeout: float = 600.0,
                 connect_timeout: float = 10.0, api_key: str | None = None,
                 first_byte_timeout: float = FIRST_BYTE_TIMEOUT,
                 stream_interval: float = 0.0) -> None:
        try:  # at the boundary: a URL the client cannot use fails here, not on a first call
            split(base_url)
        except ValueError:
            raise ValueError(f"the engine URL {base_url!r} is not an http(s) URL, e.g. "
                             "http://127.0.0.1:8000") from None
        self.base_url = base_url
        if not 0 <= stream_interval <= 1:
            raise ValueError(f"stream_interval {stream_interval!r}: seconds from 0 to 1")
        self.first_byte_timeout = first_byte_timeout
        self.stream_interval = stream_interval
        self._timeouts = {"connect_timeout": connect_timeout, "read_timeout": read_timeout}
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._client: Client | None = None

    async def start(self) -> None:
        self._client = Client(headers=self._headers, **self._timeouts)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    @property
    def _http(self) -> Client:
        if self._client is None:
            raise RuntimeError("the engine's start() was not awaited")
        return self._client

    # ---------------------------------------------------------------- JSON
    async def get(self, url: str, action: str) -> dict[str, Any]:
        """The JSON object at `url`; anything else is an error."""
        with self.failures(action):
            async with await self._http.request("GET", url) as resp:
                return await json_or_error(resp)

    async def get_if_ok(self, url: str) -> dict[str, Any] | None:
        """The JSON object at `url` if it answers 200 with one; None on any failure."""
        try:
            async with await self._http.request("GET", url) as resp:
                if resp.status == 200:
                    body = loose(await resp.read())
                    return body if isinstance(body, dict) else None
        except (TransportError, TimeoutError):
            pass
        return None

    async def post(self, url: str, payload: bytes, action: str) -> dict[str, Any]:
        """A quick call's JSON answer (no health checks while it is awaited)."""
        with self.failures(action):
            async with await self._http.request("POST", url, payload) as resp:
                return await json_or_error(resp)

    # ---------------------------------------------------------------- model calls
    async def answer(self, url: str, payload: bytes) -> bytes:
        """A non-streamed model call's body (status 200)."""
        with self.failures("answer"):
            async with self._begun(url, payload) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise engine_error(resp.status, loose(raw), raw)
        return raw

    async def events(self, url: str, payload: bytes) -> AsyncGenerator[list[str], None]:
        """A streamed model call's SSE data, one list per read from the socket (tokens
        that arrived together stay together), then one for what the stream ends with."""
        decoder = SSEDecoder()
        async for data in self._reads(url, payload, decoder,
                                      lambda piece: [e.data for e in decoder.feed(piece)]):
            yield data

    async def event_data(self, url: str, payload: bytes
                         ) -> AsyncGenerator[list[bytes | str], None]:
        """`events`, with the data of the common events as the bytes they arrived in (no
        decoding to text: a JSON decoder takes bytes; see `SSEDecoder.feed_data`)."""
        decoder = SSEDecoder()
        async for data in self._reads(url, payload, decoder, decoder.feed_data):
            yield data

    async def _reads(self, url: str, payload: bytes, decoder: SSEDecoder,
                     feed: Callable[[bytes], list[_Data]]) -> AsyncGenerator[list[_Data], None]:
        """The streamed call's reads, each `feed` to `decoder`, then what it ends with."""
        with self.failures("send its next tokens"):
            async with self._begun(url, payload) as resp:
                if resp.status != 200:
                    await json_or_error(resp)
                resp.pace(self.stream_interval)
                read = resp.readany
                while piece := await read():  # b"" is the end of the body
                    yield feed(piece)
                yield [cast(_Data, e.data) for e in decoder.finish()]  # text: either kind

    @contextlib.contextmanager
    def failures(self, action: str) -> Iterator[None]:
        """Transport failures as our errors."""
        try:
            yield
        except TimeoutError as exc:
            raise EngineTimeout(f"the engine did not {action} in time") from exc
        except TransportError as exc:
            raise EngineUnavailable(
                f"the engine at {self.base_url} is unreachable or broke off: {exc}") from exc

    @contextlib.asynccontextmanager
    async def _begun(self, url: str, payload: bytes) -> AsyncIterator[Response]:
        """The engine's response to a call, once it has begun (status and headers)."""
        sending = asyncio.ensure_future(self._http.request("POST", url, payload))
        try:
            while not sending.done():
                done, _ = await asyncio.wait({sending}, timeout=self.first_byte_timeout)
                if not done and not await self._alive():
                    raise EngineTimeout(
                        f"the engine sent nothing for {self.first_byte_timeout:g} s and did "
                        "not answer a health check: it is stuck or gone")
        except BaseException:
            sending.cancel()
            if sending.done() and not sending.cancelled() and sending.exception() is None:
                sending.result().release()  # it began just as we gave up on it
            raise
        async with sending.result() as resp:
            yield resp

    async def _alive(self) -> bool:
        """Whether the engine answers `GET /health` (any answer below 500: an endpoint
        without the route is up too)."""
        try:
            async with asyncio.timeout(min(self.first_byte_timeout, PROBE_MAX)):
                async with await self._http.request("GET", f"{self.base_url}/health") as resp:
                    return resp.status < 500
        except (TransportError, TimeoutError):
            return False


async def json_or_error(resp: Response) -> dict[str, Any]:
    raw = await resp.read()
    body = loose(raw)
    if resp.status >= 400 or not isinstance(body, dict):
        raise engine_error(resp.status, body, raw)
    return body


def loose(raw: bytes) -> Any:
    """Any JSON, or None: for error bodies, whose shape varies."""
    try:
        return _decode(raw) if raw else {}
    except msgspec.DecodeError:
        return None


def engine_error(status: int, body: Any, raw: bytes) -> Exception:
    """What the engine's answer with `status` (its body decoded and raw) means to us."""
    message = raw[:500].decode("utf-8", "replace")
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            message = str(err.get("message", message))
        elif isinstance(body.get("message"), str):
            message = body["message"]
    if status == 200:
        return EngineError(f"the engine answered with something that is not a JSON object: "
                           f"{message[:200]!r}")
    if 400 <= status < 500 and status not in (401, 403, 404, 429):
        # The engine refused this request (too long a prompt, a bad value): the client can
        # fix it, so it must not look like a server fault that invites retries.
        return InvalidRequest(f"the engine rejected the request: {message}")
    return EngineError(f"the engine failed with HTTP {status}: {message}")
