"""vLLM in chat mode: canonical requests go to `/v1/chat/completions` with
`return_token_ids` and `logprobs`, streamed when the client streams, so every token chunk
is passed on as vLLM produces it.

Two limits on waiting: `read_timeout` (the generation limit) bounds any silence once the
engine answers; `first_byte_timeout` bounds how long it may stay silent before it begins
to answer without being asked whether it is alive (`GET /health`). A streamed answer begins
at once, so a silent engine is one that is stuck or gone. A non-streamed answer begins
only when it is done, so there the check keeps a long generation going, and ends a call
to an engine that no longer answers anything, within `first_byte_timeout` + `_PROBE_MAX`
seconds instead of the generation limit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any

import aiohttp
import msgspec

from harnessrl.errors import EngineError, EngineTimeout, EngineUnavailable, InvalidRequest
from harnessrl.proxy.engines import openai_wire
from harnessrl.proxy.engines.base import Stateless
from harnessrl.proxy.sse import SSEDecoder
from harnessrl.types import (
    ChatRequest,
    Chunk,
    Delta,
    EngineEvent,
    Finished,
    FinishReason,
    ReasoningDelta,
    Started,
    TextDelta,
    TokenId,
    ToolCallDelta,
    Usage,
)

_FINISH: dict[str, FinishReason] = {
    "stop": "stop", "length": "length", "tool_calls": "tool_calls", "function_call": "tool_calls",
    "content_filter": "content_filter", "abort": "error",
}
FIRST_BYTE_TIMEOUT = 30.0
_PROBE_MAX = 10.0  # a health check slower than this counts as no answer
_decode = msgspec.json.decode
_encode = msgspec.json.encode


class VLLMEngine(Stateless):
    name = "vllm"

    def __init__(self, base_url: str, *, read_timeout: float = 600.0,
                 connect_timeout: float = 10.0, api_key: str | None = None,
                 first_byte_timeout: float = FIRST_BYTE_TIMEOUT) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.weight_version: str | None = None
        self.first_byte_timeout = first_byte_timeout
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout, sock_read=read_timeout)
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, headers=self._headers)
        await self.refresh_weight_version()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def refresh_weight_version(self) -> None:
        """vLLM reports it only in dev mode (`/weight_info`); otherwise it stays unknown."""
        try:
            async with self._http.get(f"{self.base_url}/weight_info") as resp:
                if resp.status == 200:
                    version = (await resp.json()).get("weight_version")
                    self.weight_version = None if version is None else str(version)
        except (aiohttp.ClientError, ValueError, TimeoutError):
            self.weight_version = None

    @property
    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("VLLMEngine.start() was not awaited")
        return self._session

    async def models(self) -> list[str]:
        with self._upstream("list its models"):
            async with self._http.get(f"{self.base_url}/v1/models") as resp:
                body = await _json_or_error(resp)
        return [m["id"] for m in body.get("data", [])]

    @contextlib.contextmanager
    def _upstream(self, action: str) -> Iterator[None]:
        """Transport failures as our errors. aiohttp's read timeout is both a ClientError
        and a TimeoutError: it is a timeout."""
        try:
            yield
        except TimeoutError as exc:
            raise EngineTimeout(f"the engine did not {action} in time") from exc
        except aiohttp.ClientError as exc:
            raise EngineUnavailable(
                f"the engine at {self.base_url} is unreachable or broke off: {exc}") from exc

    @contextlib.asynccontextmanager
    async def _post(self, url: str, payload: bytes) -> AsyncIterator[aiohttp.ClientResponse]:
        """The engine's response to a call, once it has begun (status and headers)."""
        sending = asyncio.ensure_future(self._send(url, payload))
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

    async def _send(self, url: str, payload: bytes) -> aiohttp.ClientResponse:
        return await self._http.post(url, data=payload)

    async def _alive(self) -> bool:
        """Whether the engine answers `GET /health` (any answer below 500: an endpoint
        without the route is up too)."""
        timeout = aiohttp.ClientTimeout(total=min(self.first_byte_timeout, _PROBE_MAX))
        try:
            async with self._http.get(f"{self.base_url}/health", timeout=timeout) as resp:
                return resp.status < 500
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def count_tokens(self, request: ChatRequest) -> int:
        """vLLM renders the chat template and tokenizes it: the count the model sees."""
        body: dict[str, Any] = {"model": request.model, "add_generation_prompt": True,
                                "messages": openai_wire.messages(request)}
        if request.tools:
            body["tools"] = openai_wire.tools(request.tools)
        with self._upstream("count tokens"):
            async with self._http.post(f"{self.base_url}/tokenize", data=_encode(body)) as resp:
                answer = await _json_or_error(resp)
        return int(answer["count"])

    def _chat_call(self, request: ChatRequest, *, stream: bool) -> tuple[str, bytes]:
        """The URL and body of the upstream chat call (the teacher engine sends less)."""
        return (f"{self.base_url}/v1/chat/completions",
                _encode(openai_wire.chat_body(request, stream=stream)))

    async def complete(self, request: ChatRequest, rollout: str | None = None
                       ) -> list[EngineEvent]:
        url, payload = self._chat_call(request, stream=False)
        with self._upstream("answer"):
            async with self._post(url, payload) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise _engine_error(resp.status, _loose(raw), raw)
        return _events_from_completion(raw)

    async def stream(self, request: ChatRequest, rollout: str | None = None
                     ) -> AsyncGenerator[EngineEvent, None]:
        url, payload = self._chat_call(request, stream=True)
        parser = _StreamParser()
        with self._upstream("send its next tokens"):
            async with self._post(url, payload) as resp:
                if resp.status != 200:
                    await _json_or_error(resp)
                decoder = SSEDecoder()
                async for piece in resp.content.iter_any():
                    # Tokens that arrived in one read go on as one chunk: one write to
                    # the client instead of one per token when the engine is ahead of us.
                    for event in merge_chunks(
                            [e for sse in decoder.feed(piece) for e in parser.feed(sse.data)]):
                        yield event
                for event in [e for sse in decoder.finish() for e in parser.feed(sse.data)]:
                    yield event
        yield parser.finish()


async def _json_or_error(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    raw = await resp.read()
    body = _loose(raw)
    if resp.status >= 400 or not isinstance(body, dict):
        raise _engine_error(resp.status, body, raw)
    return body


def _loose(raw: bytes) -> Any:
    """Any JSON, or None: for error bodies, whose shape varies."""
    try:
        return _decode(raw) if raw else {}
    except msgspec.DecodeError:
        return None


def _engine_error(status: int, body: Any, raw: bytes) -> Exception:
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


def merge_chunks(events: list[EngineEvent]) -> list[EngineEvent]:
    """Adjacent chunks as one, when both carry ids and logprobs (or both lack them)."""
    merged: list[EngineEvent] = []
    for event in events:
        last = merged[-1] if merged else None
        if (isinstance(event, Chunk) and isinstance(last, Chunk)
                and (last.token_ids is None) == (event.token_ids is None)
                and (last.logprobs is None) == (event.logprobs is None)):
            merged[-1] = Chunk(
                last.deltas + event.deltas,
                None if last.token_ids is None else last.token_ids + event.token_ids,
                None if last.logprobs is None else last.logprobs + event.logprobs)
        else:
            merged.append(event)
    return merged


# vLLM's answer, typed: decoding straight into these skips every field we do not use
# (top_logprobs, bytes, ...) and gives token ids as tuples without a copy.
class _Logprob(msgspec.Struct):
    logprob: float


class _Logprobs(msgspec.Struct):
    content: list[_Logprob] | None = None


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(msgspec.Struct):
    index: int | None = None
    id: str | None = None
    function: _Function | None = None


class _Message(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(msgspec.Struct):
    message: _Message | None = None
    delta: _Message | None = None
    finish_reason: str | None = None
    token_ids: tuple[TokenId, ...] | None = None
    logprobs: _Logprobs | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Body(msgspec.Struct):
    model: str = ""
    prompt_token_ids: tuple[TokenId, ...] | None = None
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: Any = None


_decode_body = msgspec.json.Decoder(_Body).decode


def _parse_body(raw: bytes | str, what: str) -> _Body:
    try:
        body = _decode_body(raw)
    except msgspec.DecodeError as exc:
        raise EngineError(f"the engine sent {what} that is not the expected JSON ({exc}): "
                          f"{raw[:200]!r}") from exc
    if body.error is not None:
        raise _engine_error(500, {"error": body.error}, b"")
    return body


def _tokens(choice: _Choice) -> tuple[tuple[int, ...] | None, tuple[float, ...] | None]:
    content = choice.logprobs.content if choice.logprobs is not None else None
    logprobs = None if content is None else tuple([c.logprob for c in content])
    return choice.token_ids, logprobs


def _deltas(message: _Message | None) -> list[Delta]:
    if message is None:
        return []
    deltas: list[Delta] = []
    reasoning = message.reasoning_content or message.reasoning
    if reasoning:
        deltas.append(ReasoningDelta(reasoning))
    if message.content:
        deltas.append(TextDelta(message.content))
    for position, call in enumerate(message.tool_calls or ()):
        function = call.function or _Function()
        deltas.append(ToolCallDelta(
            index=position if call.index is None else call.index, id=call.id,
            name=function.name, arguments=function.arguments or ""))
    return deltas


def _usage(body: _Body) -> Usage | None:
    usage = body.usage
    return None if usage is None else Usage(usage.prompt_tokens, usage.completion_tokens)


def _events_from_completion(raw: bytes) -> list[EngineEvent]:
    body = _parse_body(raw, "an answer")
    if not body.choices:
        raise EngineError("the engine answered with no choices")
    choice = body.choices[0]
    ids, logprobs = _tokens(choice)
    events: list[EngineEvent] = [Started(body.model, body.prompt_token_ids),
                                 Chunk(tuple(_deltas(choice.message)), ids, logprobs)]
    if choice.finish_reason is not None:  # without one the reply is not known to be whole
        events.append(Finished(_FINISH.get(choice.finish_reason, "stop"), _usage(body)))
    return events


class _StreamParser:
    """vLLM chat chunks (already split from SSE) in, engine events out."""

    def __init__(self) -> None:
        self._started = False
        self._finish: FinishReason | None = None
        self._usage: Usage | None = None

    def feed(self, data: str) -> list[EngineEvent]:
        if data == "[DONE]":
            return []
        body = _parse_body(data, "a chunk")
        events: list[EngineEvent] = []
        if not self._started:
            self._started = True
            events.append(Started(body.model, body.prompt_token_ids))
        self._usage = _usage(body) or self._usage
        for choice in body.choices:
            ids, logprobs = _tokens(choice)
            deltas = _deltas(choice.delta)
            if deltas or ids:
                events.append(Chunk(tuple(deltas), ids, logprobs))
            if choice.finish_reason is not None:
                self._finish = _FINISH.get(choice.finish_reason, "stop")
        return events

    def finish(self) -> Finished:
        if self._finish is None:
            raise EngineError("the engine stream ended before a finish_reason")
        return Finished(self._finish, self._usage)
