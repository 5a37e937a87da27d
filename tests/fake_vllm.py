"""A programmable stand-in for vLLM's chat endpoint, for fault tests of the vLLM engine.

It answers in vLLM's own shapes (token_ids, prompt_token_ids, logprobs.content), or, when
told, with an error status, garbage, or a stream cut off in the middle.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

PROMPT_IDS = [1, 2, 3, 4]
TOKENS = [("Hel", 10, -0.5), ("lo", 11, -0.25), ("!", 12, -1.0), ("", 99, -0.125)]


class FakeVLLM:
    def __init__(self, *, slow: float = 5.0) -> None:
        self.mode = "ok"  # ok | error400 | error500 | garbage | cut | slow
        self.slow = slow  # seconds the `slow` mode waits before it answers
        self.requests: list[dict[str, Any]] = []

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/v1/models", self.models),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
        ])

    async def models(self, _request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        if self.mode == "error400":
            return JSONResponse({"error": {"message": "This model's maximum context length is "
                                           "2048 tokens", "type": "BadRequestError"}}, 400)
        if self.mode == "error500":
            return JSONResponse({"error": {"message": "engine core died"}}, 500)
        if self.mode == "garbage":
            return Response(b"<html>oops", media_type="text/html")
        if self.mode == "slow":
            await asyncio.sleep(self.slow)
        if body.get("stream"):
            return StreamingResponse(self._stream(), media_type="text/event-stream")
        return JSONResponse({
            "id": "x", "model": "fake", "prompt_token_ids": PROMPT_IDS,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "Hello!"},
                         "token_ids": [t[1] for t in TOKENS],
                         "logprobs": {"content": [{"token": t[0], "logprob": t[2]}
                                                  for t in TOKENS]}}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 4}})

    async def _stream(self):
        head = {"id": "x", "object": "chat.completion.chunk", "model": "fake"}
        first = {**head, "prompt_token_ids": PROMPT_IDS,
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                              "token_ids": [], "logprobs": None}]}
        yield f"data: {json.dumps(first)}\n\n".encode()
        for i, (text, token, logprob) in enumerate(TOKENS):
            if self.mode == "cut" and i == 2:
                raise RuntimeError("engine killed mid-stream")
            finish = "stop" if i == len(TOKENS) - 1 else None
            chunk = {**head, "choices": [{
                "index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish,
                "token_ids": [token],
                "logprobs": {"content": [{"token": text, "logprob": logprob}]}}]}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
            await asyncio.sleep(0.01)
        usage = {**head, "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 4}}
        yield f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode()
