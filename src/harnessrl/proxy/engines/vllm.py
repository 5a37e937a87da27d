"""vLLM in chat mode: canonical requests go to `/v1/chat/completions` with
`return_token_ids` and `logprobs`, streamed when the client streams, so every token chunk
is passed on as vLLM produces it. The calls and their limits on waiting are `upstream`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable
from typing import Any

import msgspec

from harnessrl.errors import EngineError
from harnessrl.proxy.engines import openai_wire
from harnessrl.proxy.engines.answers import (
    Choice,
    Function,
    Message,
    StreamChoice,
    decode,
    decode_chunk,
    usage,
)
from harnessrl.proxy.engines.base import Stateless
from harnessrl.proxy.engines.upstream import FIRST_BYTE_TIMEOUT, Upstream
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
    ToolCallDelta,
    Usage,
)

_FINISH: dict[str, FinishReason] = {
    "stop": "stop", "length": "length", "tool_calls": "tool_calls", "function_call": "tool_calls",
    "content_filter": "content_filter", "abort": "error",
}
_encode = msgspec.json.encode
# Fields merged into each upstream request body (tests and benchmarks force text with
# structured outputs this way).
ExtraBody = Callable[[ChatRequest], dict[str, Any] | None]


class VLLMEngine(Stateless):
    """`extra_body`: fields merged into each chat request. `chat_template` (its text) and
    `chat_template_kwargs` go with every call (and token count), as vLLM's request fields:
    the configured template renders, not the model's own (a vLLM not started here needs
    `--trust-request-chat-template` for it; `VLLMServer` sets it)."""

    name = "vllm"

    def __init__(self, base_url: str, *, read_timeout: float = 600.0,
                 connect_timeout: float = 10.0, api_key: str | None = None,
                 first_byte_timeout: float = FIRST_BYTE_TIMEOUT,
                 extra_body: ExtraBody | None = None, stream_interval: float = 0.0,
                 chat_template: str | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.template: dict[str, Any] = {k: v for k, v in (
            ("chat_template", chat_template),
            ("chat_template_kwargs", chat_template_kwargs or None)) if v is not None}
        self.weight_version: str | None = None
        self.extra_body = extra_body
        self.http = Upstream(self.base_url, read_timeout=read_timeout,
                             connect_timeout=connect_timeout, api_key=api_key,
                             first_byte_timeout=first_byte_timeout,
                             stream_interval=stream_interval)

    async def start(self) -> None:
        await self.http.start()
        self.weight_version = await weight_version(self.http)

    async def close(self) -> None:
        await self.http.close()

    async def models(self) -> list[str]:
        return [m["id"] for m in await served_models(self.http)]

    async def count_tokens(self, request: ChatRequest) -> int:
        """vLLM renders the chat template and tokenizes it: the count the model sees."""
        body: dict[str, Any] = {"model": request.model, "add_generation_prompt": True,
                                "messages": openai_wire.messages(request), **self.template}
        if request.tools:
            body["tools"] = openai_wire.tools(request.tools)
        answer = await self.http.post(f"{self.base_url}/tokenize", _encode(body),
                                      "count tokens")
        return int(answer["count"])

    def _payload(self, request: ChatRequest, *, stream: bool) -> bytes:
        body = openai_wire.chat_body(request, stream=stream)
        body.update(self.template)
        if self.extra_body is not None:
            body.update(self.extra_body(request) or {})
        return _encode(body)

    async def complete(self, request: ChatRequest, rollout: str | None = None
                       ) -> list[EngineEvent]:
        return await chat_complete(self.http, f"{self.base_url}/v1/chat/completions",
                                   self._payload(request, stream=False))

    def stream(self, request: ChatRequest, rollout: str | None = None
               ) -> AsyncGenerator[EngineEvent, None]:
        return chat_stream(self.http, f"{self.base_url}/v1/chat/completions",
                           self._payload(request, stream=True))


async def served_models(http: Upstream) -> list[dict[str, Any]]:
    """vLLM's `/v1/models` entries."""
    body = await http.get(f"{http.base_url}/v1/models", "list its models")
    return list(body.get("data", []))


async def weight_version(http: Upstream) -> str | None:
    """vLLM reports it only in dev mode (`/weight_info`); otherwise it stays unknown."""
    info = await http.get_if_ok(f"{http.base_url}/weight_info")
    version = None if info is None else info.get("weight_version")
    return None if version is None else str(version)


async def chat_complete(http: Upstream, url: str, payload: bytes) -> list[EngineEvent]:
    """A non-streamed chat-completions call as events."""
    return _events_from_completion(await http.answer(url, payload))


async def chat_stream(http: Upstream, url: str, payload: bytes
                      ) -> AsyncGenerator[EngineEvent, None]:
    """A streamed chat-completions call as events."""
    parser = _StreamParser()
    feed = parser.feed
    async with contextlib.aclosing(http.event_data(url, payload)) as reads:
        async for read in reads:
            if len(read) == 1:  # one token per read: an engine no faster than we are
                events = feed(read[0])
                if len(events) == 1:
                    yield events[0]
                    continue
            else:
                events = [e for data in read for e in feed(data)]
            # Tokens that arrived in one read go on as one chunk: one write to the client
            # instead of one per token when the engine is ahead of us.
            for event in merge_chunks(events):
                yield event
    yield parser.finish()


def merge_chunks(events: list[EngineEvent]) -> list[EngineEvent]:
    """Adjacent chunks as one, when both carry ids and logprobs (or both lack them). Each
    run of such chunks is joined once (a read of a paced or busy stream holds hundreds)."""
    if len(events) < 2:
        return events
    merged: list[EngineEvent] = []
    run: list[Chunk] = []
    for event in events:
        if type(event) is Chunk:
            if run and not _mergeable(run[-1], event):
                merged.append(_one_chunk(run))
                run = []
            run.append(event)
            continue
        if run:
            merged.append(_one_chunk(run))
            run = []
        merged.append(event)
    if run:
        merged.append(_one_chunk(run))
    return merged


def _mergeable(last: Chunk, event: Chunk) -> bool:
    return ((last.token_ids is None) == (event.token_ids is None)
            and (last.logprobs is None) == (event.logprobs is None))


def _one_chunk(run: list[Chunk]) -> Chunk:
    if len(run) == 1:
        return run[0]
    first = run[0]
    return Chunk(tuple([d for c in run for d in c.deltas]),
                 None if first.token_ids is None else tuple(
                     [i for c in run for i in c.token_ids or ()]),
                 None if first.logprobs is None else tuple(
                     [x for c in run for x in c.logprobs or ()]))


def _tokens(choice: Choice | StreamChoice
            ) -> tuple[tuple[int, ...] | None, tuple[float, ...] | None]:
    content = choice.logprobs.content if choice.logprobs is not None else None
    if content is None:
        return choice.token_ids, None
    if len(content) == 1:  # a stream chunk's one token
        return choice.token_ids, (content[0].logprob,)
    return choice.token_ids, tuple([c.logprob for c in content])


def _deltas(message: Message | None) -> list[Delta]:
    if message is None:
        return []
    deltas: list[Delta] = []
    reasoning = message.reasoning_content or message.reasoning
    if reasoning:
        deltas.append(ReasoningDelta(reasoning))
    if message.content:
        deltas.append(TextDelta(message.content))
    for position, call in enumerate(message.tool_calls or ()):
        function = call.function or Function()
        deltas.append(ToolCallDelta(
            index=position if call.index is None else call.index, id=call.id,
            name=function.name, arguments=function.arguments or ""))
    return deltas


def _events_from_completion(raw: bytes) -> list[EngineEvent]:
    body = decode(raw, "an answer")
    if not body.choices:
        raise EngineError("the engine answered with no choices")
    choice = body.choices[0]
    ids, logprobs = _tokens(choice)
    events: list[EngineEvent] = [Started(body.model, body.prompt_token_ids),
                                 Chunk(tuple(_deltas(choice.message)), ids, logprobs)]
    if choice.finish_reason is not None:  # without one the reply is not known to be whole
        events.append(Finished(_FINISH.get(choice.finish_reason, "stop"), usage(body)))
    return events


class _StreamParser:
    """vLLM chat chunks (already split from SSE) in, engine events out."""

    def __init__(self) -> None:
        self._started = False
        self._finish: FinishReason | None = None
        self._usage: Usage | None = None

    def feed(self, data: bytes | str) -> list[EngineEvent]:
        if data == b"[DONE]" or data == "[DONE]":
            return []
        body = decode_chunk(data)
        if self._started and body.usage is None and len(body.choices) == 1:
            choice = body.choices[0]  # a token of text, the common chunk: its event directly
            delta = choice.delta
            if (choice.finish_reason is None and delta is not None and delta.content
                    and delta.tool_calls is None and not delta.reasoning_content
                    and not delta.reasoning):
                ids, logprobs = _tokens(choice)
                return [Chunk((TextDelta(delta.content),), ids, logprobs)]
        events: list[EngineEvent] = []
        if not self._started:
            self._started = True
            events.append(Started(body.model, body.prompt_token_ids))
        if body.usage is not None:
            self._usage = usage(body)
        for choice in body.choices:
            ids, logprobs = _tokens(choice)
            delta = choice.delta
            if (delta is not None and delta.content and delta.tool_calls is None
                    and not delta.reasoning_content and not delta.reasoning):
                deltas: tuple[Delta, ...] = (TextDelta(delta.content),)  # a token of text
            else:
                deltas = tuple(_deltas(delta))
            if deltas or ids:
                events.append(Chunk(deltas, ids, logprobs))
            if choice.finish_reason is not None:
                self._finish = _FINISH.get(choice.finish_reason, "stop")
        return events

    def finish(self) -> Finished:
        if self._finish is None:
            raise EngineError("the engine stream ended before a finish_reason")
        return Finished(self._finish, self._usage)
