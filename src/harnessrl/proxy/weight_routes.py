"""The weight gate over HTTP, for a trainer in another process than the proxy.

A trainer that swaps the engine's weights holds the gate (`proxy/gate.py`) first, so new
model calls wait and the running ones finish on the old weights. In one process it calls
`WeightGate.hold` itself; when the proxy runs elsewhere (TRL's harness worker spawns its
rollouts in a child process) it calls these:

- `POST /weights/hold` `{"timeout": 600}`: answers once no call is in flight (new ones
  are held); on timeout the gate opens again and the answer is a 504 naming the calls.
- `POST /weights/release` `{"version": "v3"}`: the engine records `version` on the calls
  admitted from now on, and the held calls go on.

- `POST /weights/close`, `POST /weights/open`: the colocated schedule's step: new calls
  wait from now on (the running ones are not waited for) until `open`.

All need the admin token when the proxy has one. Errors are in the OpenAI shape, as the
rollout routes answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from harnessrl.errors import AuthenticationFailed, EngineTimeout, InvalidRequest
from harnessrl.proxy.config import ProxySettings
from harnessrl.proxy.dialects import openai_chat
from harnessrl.proxy.engines.base import Engine
from harnessrl.proxy.gate import GateTimeout, WeightGate
from harnessrl.proxy.wire.boundary import as_error, bearer, error_response, read_decoded

_T = TypeVar("_T")


class Hold(msgspec.Struct, forbid_unknown_fields=True):
    timeout: float = 600.0


class Empty(msgspec.Struct, forbid_unknown_fields=True):
    pass


class Release(msgspec.Struct, forbid_unknown_fields=True):
    version: str | None = None  # None: the calls keep the version they had


class WeightRoutes:
    def __init__(self, gate: WeightGate, engine: Engine, config: ProxySettings) -> None:
        self.gate = gate
        self.engine = engine
        self.config = config

    def routes(self) -> list[Route]:
        return [Route("/weights/hold", self._answer(self.hold), methods=["POST"]),
                Route("/weights/release", self._answer(self.release), methods=["POST"]),
                Route("/weights/close", self._answer(self.close), methods=["POST"]),
                Route("/weights/open", self._answer(self.open), methods=["POST"])]

    async def hold(self, request: Request) -> dict[str, object]:
        body = await self._body(request, Hold)
        try:
            await asyncio.to_thread(self.gate.hold, body.timeout)
        except GateTimeout as exc:
            raise EngineTimeout(str(exc)) from None
        return {"held": True, "waiting": self.gate.waiting}

    async def release(self, request: Request) -> dict[str, object]:
        body = await self._body(request, Release)
        if body.version is not None:
            self.engine.weight_version = body.version
        self.gate.release()
        return {"held": False, "weight_version": self.engine.weight_version}

    async def close(self, request: Request) -> dict[str, object]:
        await self._body(request, Empty)
        self.gate.close()
        return {"closed": True, "inflight": self.gate.inflight}

    async def open(self, request: Request) -> dict[str, object]:
        await self._body(request, Empty)
        self.gate.open()
        return {"closed": False, "waiting": self.gate.waiting}

    async def _body(self, request: Request, kind: type[_T]) -> _T:
        token = self.config.admin_token
        if token is not None and bearer(request) != token:
            raise AuthenticationFailed("this endpoint needs the admin token as the bearer token")
        raw = await read_decoded(request, self.config.max_body_bytes)
        try:
            return msgspec.json.decode(raw or b"{}", type=kind)
        except msgspec.ValidationError as exc:
            raise InvalidRequest(f"{request.url.path}: {exc}") from None
        except msgspec.DecodeError:
            raise InvalidRequest(f"{request.url.path}: the body is not JSON") from None

    @staticmethod
    def _answer(handler: Callable[[Request], Awaitable[dict[str, object]]]
                ) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            try:
                return Response(msgspec.json.encode(await handler(request)),
                                media_type="application/json")
            except Exception as exc:  # in shape, never a bare 500
                return error_response(openai_chat.DIALECT, as_error(exc))
        return handle
