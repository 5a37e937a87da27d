"""The capture proxy: an ASGI app that serves every dialect at `/r/<key>/...` (and at the
root, with the key as the API key), forwards to the engine, and records every call.

A turn is committed to the store *before* the last bytes of its reply leave, so a call
the client saw finish is never missing from the store. It is committed `ok` only if the
client is still there then, and becomes `cancelled` if the client turns out to have left
before the last byte was handed to the server (docs/concepts/engine-http.md): a reply the harness
never got must not be trained as a step it took.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from harnessrl.errors import EngineError, HarnessRLError, NotFound, StoreFailed
from harnessrl.proxy.config import ProxySettings
from harnessrl.proxy.dialects import Endpoint, endpoints
from harnessrl.proxy.dialects.base import (
    CountTokens,
    Dialect,
    Generate,
    ListModels,
    Operation,
    ReplyContext,
    StreamEncoder,
    StreamOptions,
)
from harnessrl.proxy.engines.base import Engine
from harnessrl.proxy.gate import WeightGate
from harnessrl.proxy.rollout_routes import RolloutRoutes
from harnessrl.proxy.sessions import OpenRollout, Sessions
from harnessrl.proxy.weight_routes import WeightRoutes
from harnessrl.proxy.wire import nesting
from harnessrl.proxy.wire.accumulate import Accumulator
from harnessrl.proxy.wire.boundary import (
    RELAYED,
    TURN,
    WholeReply,
    Wire,
    as_error,
    client_gone,
    decode_json,
    error_response,
    read_body,
    read_decoded,
    request_key,
    unless_disconnected,
)
from harnessrl.proxy.wire.history import check_arguments, check_tool_results, restore_arguments
from harnessrl.types import (
    ChatRequest,
    Chunk,
    EngineEvent,
    Finished,
    Sampling,
    Timings,
    Tokens,
    Turn,
)

_encode = msgspec.json.Encoder().encode
_JSON = "application/json"
_NO_TOKENS = Tokens(None, None, None)


@dataclass
class _Call:
    """The state of one model call while it runs."""

    rollout: OpenRollout
    dialect: Dialect
    index: int
    received: float
    wire: Wire
    retry_of: int | None
    request: ChatRequest
    used: Sampling
    ctx: ReplyContext
    gate: WeightGate
    # read when the gate admitted the call: no weight swap starts until it leaves
    weight_version: str | None = None
    first_token: float | None = None
    sent: list[bytes] = field(default_factory=list)
    recorded: bool = False
    stored_ok: bool = False  # its turn was committed ok
    delivered: bool = False  # its reply's last byte was handed to a client still there
    relayed: bool = False  # it came through another worker's relay
    left: bool = False

    def headers(self, **headers: str) -> dict[str, str]:
        """The answer's headers; to a relay, the turn's index too (`proxy/relay.py`)."""
        if self.relayed:
            headers[TURN.decode()] = str(self.index)
        return headers

    def leave(self) -> None:
        """Out of the gate, once, whichever path ends the call."""
        if not self.left:
            self.left = True
            self.gate.leave()

    async def leave_async(self) -> None:
        """`leave` as a background task: Starlette runs a plain function in a worker
        thread, a thread hop per streamed call for a few lines of bookkeeping."""
        self.leave()


class Proxy:
    def __init__(self, engine: Engine, sessions: Sessions, config: ProxySettings | None = None):
        self.engine = engine
        self.sessions = sessions
        self.store = sessions.store
        self.config = config or ProxySettings()
        self.served: list[str] = []
        self.gate = WeightGate()  # held by a weight swap (train/async_grpo/worker.py)

    # ---------------------------------------------------------------- lifecycle
    async def startup(self) -> None:
        # Engines with per-rollout state (token mode) recover it from the store.
        self.engine.bind_store(self.store)
        await self.engine.start()
        self.served = await self.engine.models()
        if not self.served:
            raise RuntimeError("the engine serves no model")

    async def shutdown(self) -> None:
        await self.engine.close()

    def app(self) -> Starlette:
        # Model calls first, under /r/<key> first: Starlette tries routes in order, and
        # each route passed over costs a call 1-2 µs (some 50 µs for the last of 31).
        handlers = [(endpoint, self._handler(endpoint)) for endpoint in endpoints()]
        routes = [Route(f"{prefix}{endpoint.path}", handler, methods=[endpoint.method])
                  for prefix in ("/r/{key}", "") for endpoint, handler in handlers]
        routes += [
            Route("/health", self.health, methods=["GET"]),
            # Claude Code probes the root of its base URL before calling.
            Route("/", _probe, methods=["GET", "HEAD"]),
            Route("/r/{key}", _probe, methods=["GET", "HEAD"]),
            Route("/r/{key}/", _probe, methods=["GET", "HEAD"]),
            *RolloutRoutes(self.sessions, self.engine, self.config).routes(),
            *WeightRoutes(self.gate, self.engine, self.config).routes(),
        ]

        @contextlib.asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            await self.startup()
            try:
                yield
            finally:
                await self.shutdown()

        return Starlette(routes=routes, lifespan=lifespan)

    def _handler(self, endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            dialect, route = endpoint.pick(request.headers)
            try:
                operation = route.resolve(request.path_params, request.query_params)
                return await self._serve(request, dialect, operation)
            except Exception as exc:  # a bug must still answer in the client's shape
                return error_response(dialect, as_error(exc))
        return handle

    async def _serve(self, request: Request, dialect: Dialect, operation: Operation
                     ) -> Response:
        match operation:
            case Generate():
                return await self._call(request, dialect, operation)
            case CountTokens(model=model):
                return await self._count_tokens(request, dialect, model)
            case ListModels():
                return await self._models(request, dialect)

    # ---------------------------------------------------------------- health
    async def health(self, _request: Request) -> Response:
        rollouts, weight = self.sessions.store.kept()
        return Response(_encode({"status": "ok", "models": self.served,
                                 "open_rollouts": len(self.sessions),
                                 "kept_turns": {"rollouts": rollouts, "bytes": weight}}),
                        media_type=_JSON)

    # ---------------------------------------------------------------- model calls
    async def _models(self, request: Request, dialect: Dialect) -> Response:
        await self.sessions.resolve(request_key(request))
        return Response(dialect.render_models(self.served), media_type=_JSON)

    async def _count_tokens(self, request: Request, dialect: Dialect,
                            model: str | None = None) -> Response:
        """The prompt's real token count, from the served model's own template and
        tokenizer. Not a model call, so not a turn."""
        await self.sessions.resolve(request_key(request))
        body = await read_decoded(request, self.config.max_body_bytes)
        parsed = dialect.parse_count_tokens(decode_json(body), model=model)
        count = await self.engine.count_tokens(
            msgspec.structs.replace(parsed, model=self._model_for(parsed.model)))
        return Response(dialect.count_tokens_body(count), media_type=_JSON)

    def _model_for(self, requested: str) -> str:
        if requested in self.served:
            return requested
        if self.config.strict_model:
            raise NotFound(f"model {requested!r} is not served here; use one of {self.served}",
                           param="model")
        return self.served[0]

    async def _call(self, request: Request, dialect: Dialect, op: Generate) -> Response:
        received = time.time()
        rollout = await self.sessions.resolve(request_key(request))
        wire, body = Wire.of(request, b""), b""
        try:
            wire = Wire.of(request, await read_body(request, self.config.max_body_bytes))
            # Parsed from the decoded body; stored as received, with its coding.
            body = await wire.decoded(self.config.max_body_bytes)
            rollout.count_call()  # over the rollout's step cap: refused, recorded, not sent
            parsed = dialect.parse_request(decode_json(body), model=op.model, stream=op.stream)
            parsed = await self._full_history(rollout, dialect, parsed)
            engine_model = self._model_for(parsed.model)
        except Exception as exc:  # a parser bug too: answered in shape and recorded
            err = _request_error(exc)
            with contextlib.suppress(StoreFailed):
                await self._record_rejected(rollout, dialect, received, wire, body, err)
            return error_response(dialect, err)
        used = self.sessions.policy(rollout, parsed.sampling)
        await self.gate.admit()  # waits while the weights are being swapped
        index = rollout.take_index()
        call = _Call(
            rollout=rollout, dialect=dialect, index=index, received=received, wire=wire,
            retry_of=rollout.attempt(body, index, wire.retry_count), request=parsed, used=used,
            ctx=ReplyContext(f"{dialect.id_prefix}{uuid.uuid4().hex}", int(received),
                             parsed.model or engine_model),
            gate=self.gate, weight_version=self.engine.weight_version,
            relayed=RELAYED.decode() in request.headers)
        engine_request = msgspec.structs.replace(parsed, model=engine_model, sampling=used)
        if parsed.stream:
            return await self._open_stream(call, engine_request, op.options, request.receive)
        try:
            return await self._complete(call, engine_request, request)
        finally:
            call.leave()

    async def _full_history(self, rollout: OpenRollout, dialect: Dialect,
                            request: ChatRequest) -> ChatRequest:
        """The conversation as the model saw it: earlier replies chained by id filled in,
        calls restored to their sampled text, and every tool result matched to a call."""
        if (previous_id := dialect.previous_reply(request)) is not None:
            turn = await asyncio.to_thread(self.store.turn_by_reply, rollout.record.key,
                                           previous_id)
            request = dialect.expand_history(request, turn)
        check_tool_results(request)
        check_arguments(request, rollout.issued_calls)
        return restore_arguments(request, rollout.issued_calls)

    async def _complete(self, call: _Call, engine_request: ChatRequest,
                        request: Request) -> Response:
        acc = Accumulator()
        try:
            events = await unless_disconnected(request, self.engine.complete(
                engine_request, call.rollout.record.key))
            if events is None:
                # Nobody will read this reply (a harness killed at its deadline): the engine
                # stops sampling it, and the turn is kept as cancelled, never as a finished
                # step of the agent's trajectory.
                await self._record(call, acc, b"", cancelled=True)
                return Response(status_code=499)
            for event in events:
                acc.feed(event)
            if acc.finish_reason is None:
                raise _unfinished()
            body = call.dialect.render_completion(acc.completion(), call.ctx)
            # Gone while the answer was being put together: cancelled, never ok.
            await self._record(call, acc, body, cancelled=client_gone(request.receive))
        except Exception as exc:
            return await self._failed(call, acc, exc)
        if not call.stored_ok:
            return Response(status_code=499)
        return WholeReply(body, call.headers(), partial(self._undelivered, call))

    async def _failed(self, call: _Call, acc: Accumulator, exc: Exception) -> Response:
        err = as_error(exc)
        status, body = call.dialect.render_error(err)
        with contextlib.suppress(StoreFailed):
            await self._record(call, acc, body, err)
        return Response(body, status_code=status, media_type=_JSON)

    async def _open_stream(self, call: _Call, engine_request: ChatRequest,
                           options: StreamOptions, receive: Any) -> Response:
        """Wait for the engine to accept the call before answering 200, so an engine that
        is down or refuses the request gets a real HTTP error status, not an SSE event."""
        encoder = call.dialect.stream_encoder(call.request, call.ctx, options)
        events = self.engine.stream(engine_request, call.rollout.record.key)
        try:
            first = await anext(events)
        except Exception as exc:
            await events.aclose()
            call.leave()
            return await self._failed(call, Accumulator(), exc)
        except BaseException:
            call.leave()
            raise
        # The stream leaves the gate when it ends; the background task covers a body
        # that is never iterated (the client gone before the first byte).
        return StreamingResponse(self._stream(call, encoder, events, first, receive),
                                 media_type=encoder.media_type,
                                 headers=call.headers(**{"Cache-Control": "no-cache"}),
                                 background=BackgroundTask(call.leave_async))

    async def _stream(self, call: _Call, encoder: StreamEncoder,
                      rest: AsyncGenerator[EngineEvent, None],
                      first: EngineEvent, receive: Any) -> AsyncIterator[bytes]:
        acc = Accumulator()
        feed, encode, sent = acc.feed, encoder.feed, call.sent
        try:
            async with contextlib.aclosing(rest):  # closing us closes the engine's stream
                event: EngineEvent | None = first
                while event is not None:
                    feed(event)
                    out = encode(event)
                    sent.append(out)  # joined once, when the turn is recorded
                    if type(event) is Chunk:
                        if call.first_token is None:
                            call.first_token = time.time()
                    elif isinstance(event, Finished):
                        # Commit before the final event leaves: a finished stream is stored.
                        await self._record(call, acc, b"".join(sent))
                    if out:
                        yield out
                    if call.stored_ok and not call.delivered:
                        # The final event is handed over; was anyone there to take it?
                        call.delivered = True
                        if client_gone(receive):
                            await self._undelivered(call)
                    event = await anext(rest, None)
            if not call.recorded:  # the engine's events ended without a finish
                raise _unfinished()
        except Exception as exc:
            err = as_error(exc)
            out = encoder.error(err)
            call.sent.append(out)
            with contextlib.suppress(StoreFailed):
                await self._record(call, acc, b"".join(call.sent), err)
            yield out
        except BaseException:
            # The client went away (or we are shutting down): keep what was sampled. A turn
            # already committed ok whose final event never left is cancelled too.
            with anyio.CancelScope(shield=True), contextlib.suppress(StoreFailed):
                await self._record(call, acc, b"".join(call.sent), cancelled=True)
                if call.stored_ok and not call.delivered:
                    await self._undelivered(call)
            raise
        finally:
            call.leave()

    # ---------------------------------------------------------------- recording
    async def _record(self, call: _Call, acc: Accumulator, response: bytes,
                      error: HarnessRLError | None = None, *, cancelled: bool = False) -> None:
        """Store the call's turn, once: later attempts (after a failure) do nothing."""
        if call.recorded:
            return
        # Set before the write: a caller cancelled while it waits must not write again
        # (the writer commits the row anyway). Cleared when nothing was written, so the
        # error path can still record the call as failed.
        call.recorded = True
        completion = acc.completion() if acc.model is not None else None
        status = "cancelled" if cancelled else ("failed" if error is not None else "ok")
        flags = tuple(acc.flags()) if completion is not None else ()
        turn = Turn(
            rollout=call.rollout.record.key, index=call.index, dialect=call.dialect.name,
            status=status, timings=Timings(call.received, call.first_token, time.time()),
            raw_request=call.wire.raw, content_encoding=call.wire.coding,
            retry_count=call.wire.retry_count, retry_of=call.retry_of,
            raw_response=response, request=call.request,
            completion=completion, requested_sampling=call.request.sampling,
            used_sampling=call.used, engine=self.engine.name,
            model=acc.model, weight_version=call.weight_version,
            error=None if error is None else f"{error.kind}: {error.message}",
            error_kind=None if error is None else error.kind, flags=flags,
            reply_id=call.ctx.id)
        try:
            kept_failed = await self._add_or_keep_failed(turn)
        except StoreFailed:
            call.recorded = False
            raise
        if kept_failed is not None:
            raise kept_failed  # in the store, but as failed: the call did not succeed
        call.stored_ok = status == "ok"
        if completion is not None and status == "ok":
            call.rollout.remember_calls(completion.tool_calls)

    async def _undelivered(self, call: _Call) -> None:
        """The client left before the last byte of a reply whose turn is committed ok."""
        call.stored_ok = False
        with contextlib.suppress(sqlite3.Error):
            await self.store.cancel_turn(call.rollout.record.key, call.index)

    async def _add_or_keep_failed(self, turn: Turn) -> StoreFailed | None:
        """Writes `turn`; if the store refuses the row, writes it as a failed turn without
        its tokens (the part it may not hold, an id past 32 bits say), with the reason, and
        returns that reason. Raises only when nothing could be written."""
        try:
            await self._add(turn)
            return None
        except StoreFailed as err:
            if turn.completion is None or turn.completion.tokens == _NO_TOKENS:
                raise
            completion = msgspec.structs.replace(turn.completion, tokens=_NO_TOKENS)
            await self._add(msgspec.structs.replace(
                turn, status="failed", completion=completion,
                flags=(*turn.flags, "tokens_not_stored"),
                error=f"{err.kind}: {err.message}", error_kind=err.kind))
            return err

    async def _add(self, turn: Turn, *, admitted: bool = True) -> None:
        # The only call in flight commits its turn itself, without the writer thread's
        # hand-off. An admitted call has not left the gate yet, so it counts itself.
        alone = self.gate.inflight <= (1 if admitted else 0)
        try:
            await self.store.add_turn(turn, alone=alone)
        except sqlite3.Error as exc:
            raise StoreFailed(f"the trace store could not record this call ({exc}); it was "
                              "not counted") from exc

    async def _record_rejected(self, rollout: OpenRollout, dialect: Dialect, received: float,
                               wire: Wire, body: bytes, err: HarnessRLError) -> None:
        """A call refused before it reached the engine is still a recorded turn (with
        no completion: nothing was sampled), its kind saying why (`step_cap` for a call
        over the rollout's cap). `body`: the decoded body, b"" if it was not decoded."""
        _, answer = dialect.render_error(err)
        index = rollout.take_index()
        await self._add(Turn(
            rollout=rollout.record.key, index=index, dialect=dialect.name,
            status="failed", timings=Timings(received, None, time.time()),
            raw_request=wire.raw, content_encoding=wire.coding, retry_count=wire.retry_count,
            retry_of=rollout.attempt(body or wire.raw, index, wire.retry_count),
            raw_response=answer, engine=self.engine.name, error=f"{err.kind}: {err.message}",
            error_kind=err.kind), admitted=False)


# -------------------------------------------------------------------- helpers
async def _probe(_request: Request) -> Response:
    """Answers a client's reachability probe; says nothing about the server's state,
    since it needs no key."""
    return Response(b'{"status":"ok"}', media_type=_JSON)


def _unfinished() -> EngineError:
    """One rule, streamed or not: a reply is whole only when the engine says how it
    finished. Without that it cannot be told from one cut off, so the call fails (what was
    sampled is kept in its failed turn) instead of being stored as a finished step."""
    return EngineError("the engine's reply ended without a finish reason")


def _request_error(exc: Exception) -> HarnessRLError:
    """What a failure while reading a call's request means to the client. A decoder or a
    parser that runs out of stack met nesting past what the boundary checks caught."""
    if isinstance(exc, RecursionError):
        return nesting.too_deep_error("the request")
    return as_error(exc)
