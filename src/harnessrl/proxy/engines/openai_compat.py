"""Any OpenAI-compatible chat endpoint as the engine: the teacher in "distil a bigger
model" runs (a hosted API, another inference server).

It is sent only standard chat-completions fields, none of vLLM's (`return_token_ids`,
`top_logprobs`, ...), so strict endpoints accept the calls. Such an endpoint returns text
and tool calls but no token ids, so every turn is flagged `prompt_ids_missing` and
`completion_ids_missing` and is never trained on as tokens; `harnessrl export --sft
messages` turns its solved rollouts into conversations for a student's chat template.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from harnessrl.proxy.engines import openai_wire
from harnessrl.proxy.engines.vllm import (
    VLLMEngine,
    _encode,
    _engine_error,
    _events_from_completion,
    _json_or_error,
    _loose,
    _StreamParser,
    merge_chunks,
)
from harnessrl.proxy.sse import SSEDecoder
from harnessrl.types import ChatRequest, EngineEvent

# vLLM extensions and token-accounting fields a standard endpoint may reject.
_NOT_STANDARD = ("return_token_ids", "top_logprobs", "logprobs")


def teacher_body(request: ChatRequest, *, stream: bool) -> dict[str, Any]:
    body = openai_wire.chat_body(request, stream=stream)
    for name in _NOT_STANDARD:
        body.pop(name, None)
    return body


class OpenAICompatEngine(VLLMEngine):
    """`api_base` is the endpoint's OpenAI root (the URL the `openai` SDK takes, e.g.
    ending in /v1); `model` the name every call is sent with, whatever the harness asked
    for (None: the first model the endpoint lists)."""

    name = "openai"

    def __init__(self, api_base: str, *, model: str | None = None, api_key: str | None = None,
                 read_timeout: float = 600.0) -> None:
        super().__init__(api_base, read_timeout=read_timeout, api_key=api_key)
        self.api_base = api_base.rstrip("/")
        self.model = model

    async def start(self) -> None:
        await super().start()
        self.weight_version = None  # a teacher's weights are not ours to name

    async def models(self) -> list[str]:
        if self.model is not None:
            return [self.model]
        with self._upstream("list its models"):
            async with self._http.get(f"{self.api_base}/models") as resp:
                body = await _json_or_error(resp)
        return [m["id"] for m in body.get("data", [])]

    async def count_tokens(self, request: ChatRequest) -> int:
        raise NotImplementedError("an OpenAI-compatible teacher cannot count tokens")

    async def complete(self, request: ChatRequest) -> list[EngineEvent]:
        payload = _encode(teacher_body(request, stream=False))
        with self._upstream("answer"):
            async with self._http.post(f"{self.api_base}/chat/completions",
                                       data=payload) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise _engine_error(resp.status, _loose(raw), raw)
        return _events_from_completion(raw)

    async def stream(self, request: ChatRequest) -> AsyncGenerator[EngineEvent, None]:
        payload = _encode(teacher_body(request, stream=True))
        parser = _StreamParser()
        with self._upstream("send its next tokens"):
            async with self._http.post(f"{self.api_base}/chat/completions",
                                       data=payload) as resp:
                if resp.status != 200:
                    await _json_or_error(resp)
                decoder = SSEDecoder()
                async for piece in resp.content.iter_any():
                    for event in merge_chunks(
                            [e for sse in decoder.feed(piece) for e in parser.feed(sse.data)]):
                        yield event
                for event in [e for sse in decoder.finish() for e in parser.feed(sse.data)]:
                    yield event
        yield parser.finish()
