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

import msgspec

from harnessrl.errors import NotFound
from harnessrl.proxy.engines import openai_wire
from harnessrl.proxy.engines.base import Stateless
from harnessrl.proxy.engines.upstream import FIRST_BYTE_TIMEOUT, Upstream
from harnessrl.proxy.engines.vllm import chat_complete, chat_stream
from harnessrl.types import ChatRequest, EngineEvent

# vLLM extensions and token-accounting fields a standard endpoint may reject.
_NOT_STANDARD = ("return_token_ids", "top_logprobs", "logprobs")
_encode = msgspec.json.encode


def teacher_body(request: ChatRequest, *, stream: bool) -> dict[str, Any]:
    body = openai_wire.chat_body(request, stream=stream)
    for name in _NOT_STANDARD:
        body.pop(name, None)
    return body


class OpenAICompatEngine(Stateless):
    """`api_base` is the endpoint's OpenAI root (the URL the `openai` SDK takes, e.g.
    ending in /v1); `model` the name every call is sent with, whatever the harness asked
    for (None: the first model the endpoint lists)."""

    name = "openai"
    weight_version: str | None = None  # a teacher's weights are not ours to name

    def __init__(self, api_base: str, *, model: str | None = None, api_key: str | None = None,
                 read_timeout: float = 600.0,
                 first_byte_timeout: float = FIRST_BYTE_TIMEOUT,
                 stream_interval: float = 0.0) -> None:
        self.api_base = api_base.rstrip("/")
        self.model = model
        # Its health check is at the root, as vLLM's is.
        self.http = Upstream(self.api_base.removesuffix("/v1"), read_timeout=read_timeout,
                             api_key=api_key, first_byte_timeout=first_byte_timeout,
                             stream_interval=stream_interval)

    async def start(self) -> None:
        await self.http.start()

    async def close(self) -> None:
        await self.http.close()

    async def models(self) -> list[str]:
        if self.model is not None:
            return [self.model]
        body = await self.http.get(f"{self.api_base}/models", "list its models")
        return [m["id"] for m in body.get("data", [])]

    async def count_tokens(self, request: ChatRequest) -> int:
        raise NotFound("counting tokens needs the model's tokenizer, and an "
                       "OpenAI-compatible teacher engine has none here")

    async def complete(self, request: ChatRequest, rollout: str | None = None
                       ) -> list[EngineEvent]:
        return await chat_complete(self.http, f"{self.api_base}/chat/completions",
                                   _encode(teacher_body(request, stream=False)))

    def stream(self, request: ChatRequest, rollout: str | None = None
               ) -> AsyncGenerator[EngineEvent, None]:
        return chat_stream(self.http, f"{self.api_base}/chat/completions",
                           _encode(teacher_body(request, stream=True)))
