"""The rollout endpoints: `POST /rollouts`, `GET` and `DELETE /rollouts/<key>`.

They answer errors in the OpenAI shape (the one the runner and curl users read), and
nothing that reaches them, whatever its shape, gets a bare 500.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from harnessrl.errors import (
    AuthenticationFailed,
    InvalidRequest,
    NotFound,
    StoreFailed,
)
from harnessrl.proxy.config import ProxySettings
from harnessrl.proxy.dialects import openai_chat
from harnessrl.proxy.dialects.base import integer
from harnessrl.proxy.engines.base import Engine
from harnessrl.proxy.sessions import Sessions
from harnessrl.proxy.wire import nesting
from harnessrl.proxy.wire.boundary import (
    as_error,
    bearer,
    credential,
    error_response,
    page,
    read_decoded,
)
from harnessrl.types import Sampling

_encode = msgspec.json.Encoder().encode
_JSON = "application/json"
Handler = Callable[[Request], Awaitable[Response]]
_MAX_CALLS = 2**63 - 1  # SQLite's integer range: the cap is stored with the rollout


class RolloutRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The body of `POST /rollouts`; every field optional (None: the server's default)."""

    sampling: Sampling | None = None
    unset_sampling: list[str] | None = None
    metadata: dict[str, Any] | None = None
    max_model_calls: int | None = None  # the rollout's step cap


class RolloutRoutes:
    def __init__(self, sessions: Sessions, engine: Engine, config: ProxySettings) -> None:
        self.sessions = sessions
        self.store = sessions.store
        self.engine = engine
        self.config = config

    def routes(self) -> list[Route]:
        return [Route("/rollouts", _in_shape(self.create), methods=["POST"]),
                Route("/rollouts/{key}", _in_shape(self.get), methods=["GET"]),
                Route("/rollouts/{key}", _in_shape(self.delete), methods=["DELETE"])]

    def _admin(self, request: Request) -> None:
        token = self.config.admin_token
        if token is not None and bearer(request) != token:
            raise AuthenticationFailed("this endpoint needs the admin token as the bearer token")

    async def create(self, request: Request) -> Response:
        self._admin(request)
        options = parse_options(await read_decoded(request, self.config.max_body_bytes))
        try:
            record = await self.sessions.create(
                sampling=options.sampling, metadata=options.metadata,
                unset_sampling=None if options.unset_sampling is None
                else tuple(options.unset_sampling), max_model_calls=options.max_model_calls)
        except sqlite3.Error as exc:  # a full disk, say: refused in shape, not a bare 500
            raise StoreFailed(f"the trace store could not record the new rollout ({exc}); "
                              "none was made") from exc
        root = f"{str(request.base_url).rstrip('/')}/r/{record.key}"
        body = {"key": record.key, "base_url": root,
                "base_urls": {"openai": f"{root}/v1", "anthropic": root, "gemini": root},
                "max_model_calls": record.max_model_calls}
        return Response(_encode(body), status_code=201, media_type=_JSON)

    async def get(self, request: Request) -> Response:
        key = request.path_params["key"]
        if credential(request) != key:
            self._admin(request)
        record = await asyncio.to_thread(self.store.rollout, key)
        if record is None:
            raise NotFound("no rollout with that key")
        offset, limit = page(request)
        turns = await asyncio.to_thread(self.store.turns, key, offset, limit)
        # Encoded off the event loop: a page can be megabytes.
        body = await asyncio.to_thread(_encode, {"rollout": record, "turns": turns})
        return Response(body, media_type=_JSON)

    async def delete(self, request: Request) -> Response:
        key = request.path_params["key"]
        if credential(request) != key:
            self._admin(request)
        try:
            record = await self.sessions.close(key)
        except sqlite3.Error as exc:
            raise StoreFailed(f"the trace store could not record the rollout as closed "
                              f"({exc}); it stays open") from exc
        self.engine.forget_rollout(key)  # per-rollout state (token mode) is no longer needed
        return Response(_encode(record), media_type=_JSON)


def _in_shape(handler: Handler) -> Handler:
    async def handle(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:  # a bug must still answer in shape
            return error_response(openai_chat.DIALECT, as_error(exc))
    return handle


# Settings of the engine, not of a rollout: the served model has one template and one
# tool-call and reasoning format, so a rollout cannot choose its own (proxy/engines/build.py).
_ENGINE_SETTINGS = ("tool_call_parser", "reasoning_parser", "renderer", "chat_template",
                    "chat_template_kwargs")


def _refuse_engine_setting(error: str) -> None:
    """A rollout's options that name an engine setting: refused, saying where it is set."""
    unknown = re.search(r"unknown field `([^`]+)`", error)
    name = unknown.group(1) if unknown else None
    if name in _ENGINE_SETTINGS:
        from harnessrl.proxy.engines.build import EngineSettings
        from harnessrl.settings import flagged

        option = flagged(EngineSettings)[name].option_strings[0]
        raise InvalidRequest(f"`{name}` is the engine's, not a rollout's (one served model, "
                             f"one format): set it where the engine is named (`harnessrl "
                             f"serve|run|eval {option}`, the train config's [engine])",
                             param=name)


def parse_options(raw: bytes) -> RolloutRequest:
    """The body of `POST /rollouts`, validated: types, nesting, integer ranges, names."""
    try:
        options = msgspec.json.decode(raw or b"{}", type=RolloutRequest)
    except msgspec.DecodeError as exc:  # ValidationError is one too
        _refuse_engine_setting(str(exc))
        at = re.search(r"- at `\$\.(.+)`$", str(exc))  # msgspec names the field's path
        raise InvalidRequest(f"bad rollout options: {exc}",
                             param=at.group(1) if at else None) from exc
    except RecursionError as exc:
        raise nesting.too_deep_error("the body") from exc
    if options.metadata is not None and nesting.could_be_deep(raw) and nesting.depth_over(
            options.metadata):
        raise InvalidRequest(f"`metadata` is nested more than {nesting.MAX_DEPTH} levels "
                             "deep", param="metadata")
    for name, value in msgspec.structs.asdict(options.sampling or Sampling()).items():
        if isinstance(value, int) and not isinstance(value, bool):
            integer(value, f"sampling.{name}")  # msgspec takes integers of any size
    cap = options.max_model_calls
    if cap is not None and not 1 <= cap <= _MAX_CALLS:
        raise InvalidRequest("`max_model_calls` must be an integer from 1 to 2**63-1 "
                             "(the most model calls the rollout may make), got "
                             f"{cap if -_MAX_CALLS <= cap < 1 else 'one out of that range'}",
                             param="max_model_calls")
    unknown = set(options.unset_sampling or ()) - set(Sampling.__struct_fields__)
    if unknown:
        raise InvalidRequest(f"unset_sampling names unknown fields {sorted(unknown)}; "
                             f"use some of {list(Sampling.__struct_fields__)}",
                             param="unset_sampling")
    return options
