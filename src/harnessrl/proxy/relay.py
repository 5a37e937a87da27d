"""One worker's front (`serve --workers N`, see proxy/workers.py): the requests this worker
must not serve itself go elsewhere, before the proxy's app sees them.

- A model call (any dialect route) or `DELETE /rollouts/<key>` for a rollout another
  worker owns is relayed to the owner's private port: request and answer bytes unchanged,
  the answer streamed as it comes, the owner's connection closed when the client leaves
  (so the owner records the call as cancelled, as it does for a direct client), also
  while the owner has not begun to answer. The owner commits a turn before its answer's
  last byte leaves; when that byte reached this relay but the client had left before it
  could be passed on, the relay cancels the turn itself (the owner names it in a header,
  `x-harnessrl-turn`, which goes no further): a reply the client never got is never `ok`.
- `POST /weights/hold` and `/weights/release` on the shared port go to every worker: the
  gate holds them all, and a hold that fails on one is released on the others. On a
  private port they act on that worker alone (the fan-out's own requests).
- `POST /rollouts` on the shared port answers with base URLs at this worker's private port.

Everything else (reads of the shared store, health, the root probes) is served here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.routing import Route, Router
from starlette.types import ASGIApp as App
from starlette.types import Receive, Scope, Send

from harnessrl.errors import HarnessRLError, TooLarge, WorkerUnavailable
from harnessrl.http.client import Client, Response, TransportError
from harnessrl.proxy.dialects import Endpoint, endpoints, openai_chat
from harnessrl.proxy.dialects.base import Dialect
from harnessrl.proxy.wire.boundary import (
    RELAYED,
    TURN,
    as_error,
    client_gone,
    error_response,
    receive_body,
    request_key,
)
from harnessrl.proxy.workers import Plan, owner

Answer = tuple[int, bytes]
CancelTurn = Callable[[str, int], Awaitable[None]]

# Headers that describe one hop, not the message: each side writes its own.
_REQUEST_HOP = frozenset({"host", "connection", "keep-alive", "transfer-encoding",
                          "content-length", "te", "upgrade", "proxy-connection"})
_ANSWER_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"date",
                         b"server"})
_JSON = [(b"content-type", b"application/json")]


class Front:
    """The ASGI app one worker serves on both its sockets, around the proxy's app."""

    def __init__(self, app: App, plan: Plan, index: int, max_body_bytes: int,
                 cancel_turn: CancelTurn | None = None) -> None:
        self.app, self.plan, self.index = app, plan, index
        self.max_body_bytes = max_body_bytes
        # (key, index): a turn the owner committed ok whose answer the client left before
        # it was passed on whole; the run's store is every worker's
        self.cancel_turn = cancel_turn
        self._client: Client | None = None
        by_path: dict[str, dict[str, Endpoint | None]] = {}
        for endpoint in endpoints():
            for path in (f"/r/{{key}}{endpoint.path}", endpoint.path):
                by_path.setdefault(path, {})[endpoint.method] = endpoint
        by_path["/rollouts/{key}"] = {"DELETE": None}
        routes = [Route(path, _ByKey(self, methods), methods=None)
                  for path, methods in by_path.items()]
        routes += [Route(f"/weights/{action}", _Weights(self, action), methods=None)
                   for action in ("hold", "release")]
        routes.append(Route("/rollouts", _Create(self), methods=None))
        routes.append(Route("/health", _Health(self), methods=None))
        self.router = Router(routes=routes, default=app, redirect_slashes=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._ours(scope["path"]):
            await self.app(scope, receive, send)  # the lifespan, or a call this worker serves
        else:
            await self.router(scope, receive, send)

    def _ours(self, path: str) -> bool:
        """A path under /r/<key> that no route here would send elsewhere: its key is not
        one of ours (`hrl-`) or this worker owns it. Told from the path alone, so a call
        through a harness's own base URL skips this router's routes (some 50 µs a call
        for the last of them)."""
        return path.startswith("/r/") and self.owner_of(path[3:].partition("/")[0]) is None

    def owner_of(self, key: str | None) -> int | None:
        """The other worker that holds rollout `key`; None when it is this one's to serve
        (its own, or a key no worker makes)."""
        if not key or not key.startswith("hrl-"):
            return None
        worker = owner(key, self.plan.n)
        return None if worker == self.index else worker

    def public(self, scope: Scope) -> bool:
        server = scope.get("server")
        return server is not None and server[1] == self.plan.port

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    @property
    def client(self) -> Client:
        if self._client is None:  # made on the serving loop
            # A model call may be silent for as long as its generation takes: the owner
            # worker bounds that, not this hop.
            self._client = Client(connect_timeout=10.0, read_timeout=24 * 3600.0)
        return self._client

    def url(self, worker: int, scope: Scope) -> str:
        path = scope.get("raw_path") or scope["path"].encode()
        query = b"?" + scope["query_string"] if scope.get("query_string") else b""
        return (f"http://{_hostport(self.plan.host, self.plan.private[worker])}"
                f"{(path + query).decode('latin-1')}")

    def unavailable(self, worker: int, exc: BaseException) -> WorkerUnavailable:
        return WorkerUnavailable(
            f"proxy worker {worker} of {self.plan.n} (port {self.plan.private[worker]}) does "
            f"not answer ({type(exc).__name__}: {exc}); `harnessrl serve` restarts it, and "
            "the rollouts it holds resume from the store")

    # ---------------------------------------------------------------- relaying
    async def relay(self, worker: int, scope: Scope, receive: Receive, send: Send,
                    dialect: Dialect, key: str) -> None:
        body = await _body(scope, receive, send, dialect, self.max_body_bytes)
        if body is None:
            return  # refused as too large, or the client left before it finished sending
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]
                   if k.decode("latin-1") not in _REQUEST_HOP]
        headers.append((RELAYED.decode(), "1"))
        try:
            answer = await _unless_gone(receive, self.client.request(
                scope["method"], self.url(worker, scope), body, headers=headers))
        except (TransportError, TimeoutError, OSError) as exc:
            return await _send_error(send, dialect, self.unavailable(worker, exc))
        if answer is None:
            return  # the client left first: the owner's connection is closed, it cancels
        async with answer:  # an answer cut short closes the owner's connection
            if not await _pass_on(answer, receive, send):
                await self._undelivered(answer, key)

    async def _undelivered(self, answer: Response, key: str) -> None:
        """The client left before the owner's answer was passed on whole."""
        turn = answer.headers.get(TURN.decode())
        if turn is not None and turn.isdigit() and self.cancel_turn is not None:
            with contextlib.suppress(Exception):  # the store's own errors: nothing to add
                await self.cancel_turn(key, int(turn))

    async def post_all(self, path: str, body: bytes, scope: Scope
                       ) -> list[Answer | BaseException]:
        return await asyncio.gather(*(self.post_one(i, path, body, _auth(scope))
                                      for i in range(self.plan.n)), return_exceptions=True)

    async def get_one(self, worker: int, path: str) -> Answer:
        url = f"http://{_hostport(self.plan.host, self.plan.private[worker])}{path}"
        async with asyncio.timeout(5):
            async with await self.client.request("GET", url) as answer:
                return answer.status, await answer.read()

    async def post_one(self, worker: int, path: str, body: bytes,
                    headers: list[tuple[str, str]]) -> Answer:
        url = f"http://{_hostport(self.plan.host, self.plan.private[worker])}{path}"
        try:
            async with await self.client.request("POST", url, body, headers=headers) as answer:
                return answer.status, await answer.read()
        except (TransportError, OSError) as exc:
            raise self.unavailable(worker, exc) from None


class _ByKey:
    """A route whose request names a rollout: served here if this worker owns it (or it
    names none this server could own), relayed to the owner otherwise."""

    def __init__(self, front: Front, methods: dict[str, Endpoint | None]) -> None:
        self.front, self.methods = front, methods

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        if method not in self.methods:
            return await self.front.app(scope, receive, send)
        endpoint = self.methods[method]
        request = Request(scope)
        key = request_key(request)
        worker = self.front.owner_of(key)
        if worker is None:
            return await self.front.app(scope, receive, send)
        dialect = openai_chat.DIALECT if endpoint is None else endpoint.pick(request.headers)[0]
        assert key is not None  # a worker owns it
        await self.front.relay(worker, scope, receive, send, dialect, key)


class _Create:
    """`POST /rollouts` on the shared port: base URLs at this worker's own port."""

    def __init__(self, front: Front) -> None:
        self.front = front

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] == "POST" and self.front.public(scope):
            port = self.front.plan.private[self.front.index]
            scope = dict(scope, headers=_with_port(scope["headers"], port))
        await self.front.app(scope, receive, send)


class _Health:
    """`GET /health` on the shared port: ok only once every worker answers on its own port
    (a call for a rollout of one still starting would get a 503)."""

    def __init__(self, front: Front) -> None:
        self.front = front

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "GET" or not self.front.public(scope):
            return await self.front.app(scope, receive, send)
        others = [i for i in range(self.front.plan.n) if i != self.front.index]
        answers = await asyncio.gather(*(self.front.get_one(i, "/health") for i in others),
                                       return_exceptions=True)
        down = [i for i, a in zip(others, answers, strict=True)
                if not isinstance(a, tuple) or a[0] != 200]
        if not down:
            return await self.front.app(scope, receive, send)
        await _send(send, 503, msgspec.json.encode(
            {"status": "starting", "workers": self.front.plan.n, "not_answering": down}))


class _Weights:
    """`POST /weights/<action>` on the shared port: to every worker."""

    def __init__(self, front: Front, action: str) -> None:
        self.front, self.action = front, action

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST" or not self.front.public(scope):
            return await self.front.app(scope, receive, send)
        body = await _body(scope, receive, send, openai_chat.DIALECT, self.front.max_body_bytes)
        if body is None:
            return
        path = scope["path"]
        answers = await self.front.post_all(path, body, scope)
        failed = next((a for a in answers if not isinstance(a, tuple) or a[0] != 200), None)
        if failed is not None and self.action == "hold":
            # Every worker or none: the ones that did hold are opened again.
            held = [i for i, a in enumerate(answers) if isinstance(a, tuple) and a[0] == 200]
            await asyncio.gather(*(self.front.post_one(i, "/weights/release", b"{}", _auth(scope))
                                   for i in held), return_exceptions=True)
        if isinstance(failed, Exception):
            return await _send_error(send, openai_chat.DIALECT, as_error(failed))
        if isinstance(failed, BaseException):
            raise failed
        if failed is not None:
            return await _send(send, failed[0], failed[1])
        await _send(send, 200, _combined(self.action, [a for a in answers
                                                       if isinstance(a, tuple)]))


def _combined(action: str, answers: list[Answer]) -> bytes:
    bodies = [msgspec.json.decode(body) for _, body in answers]
    if action == "hold":
        merged: dict[str, object] = {"held": True,
                                     "waiting": sum(b.get("waiting", 0) for b in bodies)}
    else:
        merged = {"held": False, "weight_version": bodies[0].get("weight_version")}
    return msgspec.json.encode({**merged, "workers": len(bodies)})


# -------------------------------------------------------------------- ASGI plumbing
def _auth(scope: Scope) -> list[tuple[str, str]]:
    """The admin token the fan-out passes on to every worker."""
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]
            if k == b"authorization"]


async def _body(scope: Scope, receive: Receive, send: Send, dialect: Dialect,
                limit: int) -> bytes | None:
    """The whole request body (`boundary.receive_body`); None once a body over `limit` is
    answered in `dialect`'s error shape, or when the client left first."""
    declared = next((v.decode("latin-1") for k, v in scope["headers"]
                     if k == b"content-length"), None)
    try:
        return await receive_body(receive, limit, declared)
    except TooLarge as err:
        await _send_error(send, dialect, err)
        return None


async def _unless_gone(receive: Receive, work: Awaitable[Response]) -> Response | None:
    """`work`'s answer, or None (`work` cancelled, its connection closed) if the client
    disconnects first: a non-streamed call's answer begins only when it is done."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return None
    return task.result()


async def _pass_on(answer: Response, receive: Receive, send: Send) -> bool:
    """The owner's answer to the client as it arrives; stops (closing the owner's
    connection) when the client disconnects. Whether the answer's last byte was handed
    over to a client still there."""
    headers = [(k.lower(), v) for k, v in answer.raw_headers
               if k.lower() not in _ANSWER_HOP and k.lower() != TURN]
    passed = False

    async def pump() -> None:
        nonlocal passed
        if "content-length" in answer.headers:  # whole: looked at once, then handed over
            body = await answer.read()
            if client_gone(receive):
                return
            await send({"type": "http.response.start", "status": answer.status,
                        "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            passed = True
            return
        await send({"type": "http.response.start", "status": answer.status,
                    "headers": headers})
        while chunk := await answer.readany():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        passed = not client_gone(receive)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    pumping = asyncio.ensure_future(pump())
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({pumping, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not pumping.done():
            pumping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pumping
    if pumping.done() and not pumping.cancelled() and (exc := pumping.exception()):
        raise exc  # the owner's answer broke off: the client's connection is cut too
    return passed


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        await asyncio.sleep(0)  # a server that repeats itself must not hold the loop


async def _send(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": _JSON})
    await send({"type": "http.response.body", "body": body})


async def _send_error(send: Send, dialect: Dialect, err: HarnessRLError) -> None:
    response = error_response(dialect, err)
    await send({"type": "http.response.start", "status": response.status_code,
                "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": bytes(response.body)})


def _hostport(host: str, port: int) -> str:
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _with_port(headers: list[tuple[bytes, bytes]], port: int) -> list[tuple[bytes, bytes]]:
    """The request's headers with its Host's port replaced: the URLs the proxy answers
    with are built from it."""
    out = []
    for name, value in headers:
        if name == b"host":
            host = value.decode("latin-1")
            name_part = host[:host.index("]") + 1] if host.startswith("[") else \
                host.rsplit(":", 1)[0]
            value = f"{name_part}:{port}".encode("latin-1")
        out.append((name, value))
    return out


async def serve_worker(proxy: Any, plan: Plan, index: int) -> None:
    """Worker `index` of `plan`: the proxy on the shared port and on its own, its new
    rollout keys ones it owns."""
    from harnessrl.proxy.serve import serve
    from harnessrl.proxy.workers import listen, owned_key

    proxy.sessions.key_factory = lambda: owned_key(index, plan.n)
    sockets = [listen(plan.host, plan.port, reuse_port=True),
               listen(plan.host, plan.private[index], reuse_port=False)]
    fronts: list[Front] = []

    def wrap(app: Any) -> Front:
        fronts.append(Front(app, plan, index, proxy.config.max_body_bytes,
                            proxy.store.cancel_turn))
        return fronts[0]

    try:
        await serve(proxy, plan.host, plan.port, wrap=wrap, sockets=sockets)
    finally:
        for front in fronts:
            await front.close()
