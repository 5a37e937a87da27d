"""A scripted stand-in for vLLM's `/v1/completions` with token prompts: the backend token
mode (`TokenEngine`) talks to, over loopback, for deterministic tests and conformance.

It speaks the wire TokenEngine speaks to vLLM, in vLLM's own shapes: the prompt ids it was
sent are echoed as `prompt_token_ids`, the sampled ids come as `token_ids` with
`logprobs.token_logprobs`, `finish_reason` is `stop` at a stop id and `length` at
`max_tokens`; a streamed answer is one SSE chunk per id (the prompt ids in the first), then
a usage chunk and `[DONE]`. A prompt longer than `max_model_len` is refused with 400, as
vLLM refuses it.

What it samples is a scripted policy's reply (`scripted.Reply`), tokenized with the given
tokenizer (`scripted.sampled`: the same ids and logprobs the scripted chat engine gives).
A completions body holds only ids, not the conversation a policy reads, so the policy is
asked on the proxy's side: `extra_body(policy)` is the TokenEngine hook that asks it with
the parsed request and sends its reply in the body's `scripted_reply` field (the one field
real vLLM does not have), just as the real-vLLM token tests force a reply's text there
with structured outputs.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from harnessrl.proxy.engines.scripted import Policy, Reply, detokenize, sampled
from harnessrl.proxy.engines.vllm import ExtraBody
from harnessrl.types import ChatRequest

FIELD = "scripted_reply"


@dataclass(frozen=True)
class Sample:
    """One answer: the prompt ids reported back, each sampled id with the text it adds
    and its logprob, and why sampling stopped."""

    prompt_ids: list[int]
    ids: list[int]
    pieces: list[str]
    logprobs: list[float]
    finish: str | None


class ScriptedCompletions:
    """`tokenizer`: the served model's (the TokenEngine renders with the same one);
    `fallback`: the reply when a body brings none (a client without the hook)."""

    def __init__(self, tokenizer: Any, *, model: str = "scripted",
                 max_model_len: int = 262_144, fallback: Reply | None = None) -> None:
        self.tokenizer = tokenizer
        self.model = model
        self.max_model_len = max_model_len
        self.fallback = fallback
        self.bodies: list[dict[str, Any]] = []  # every completions body, as received

    @staticmethod
    def extra_body(policy: Policy) -> ExtraBody:
        """The TokenEngine's `extra_body`: `policy`'s reply to each request."""
        def ask(request: ChatRequest) -> dict[str, Any]:
            reply = policy(request)
            return {FIELD: {"text": reply.text, "eos": reply.eos,
                            "logprobs": None if reply.logprobs is None
                            else list(reply.logprobs)}}
        return ask

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/models", self._models),
                                 Route("/v1/completions", self._completions,
                                       methods=["POST"])])

    # ---------------------------------------------------------------- sampling
    def reply(self, body: dict[str, Any]) -> Reply | None:
        given = body.get(FIELD)
        if given is None:
            return self.fallback
        return Reply(given["text"], given.get("logprobs"), given.get("eos", True))

    def sample(self, prompt: list[int], reply: Reply, max_tokens: int | None,
               stop_ids: Sequence[int]) -> Sample:
        """The reply's ids up to and including the first stop id, at most `max_tokens`."""
        ids, logprobs = sampled(self.tokenizer, reply)
        stop = next((n + 1 for n, i in enumerate(ids) if i in stop_ids), None)
        finish = "stop" if stop is not None else None
        end = len(ids) if stop is None else stop
        if max_tokens is not None and max_tokens < end:
            end, finish = max_tokens, "length"
        ids, logprobs = ids[:end], logprobs[:end]
        if finish is None:  # the reply ran out without a stop id: vLLM would go on
            finish = "length" if max_tokens is not None and end >= max_tokens else "stop"
        return Sample(prompt, ids, detokenize(self.tokenizer, ids), logprobs, finish)

    # ---------------------------------------------------------------- the wire
    async def _models(self, _request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model, "object": "model", "max_model_len": self.max_model_len}]})

    async def _completions(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        prompt = body.get("prompt")
        if not (isinstance(prompt, list) and all(isinstance(i, int) for i in prompt)):
            return _error("this scripted server takes token prompts (a list of ids) only")
        if len(prompt) >= self.max_model_len:
            return _error(f"This model's maximum context length is {self.max_model_len} "
                          f"tokens; the prompt has {len(prompt)}")
        reply = self.reply(body)
        if reply is None:
            return _error(f"no `{FIELD}` in the body and no fallback reply")
        sample = self.sample(prompt, reply, body.get("max_tokens"),
                             body.get("stop_token_ids") or [self.tokenizer.eos_token_id])
        if body.get("stream"):
            return StreamingResponse(self.stream_events(sample), media_type="text/event-stream")
        return JSONResponse(self._whole(sample))

    def _whole(self, sample: Sample) -> dict[str, Any]:
        choice = {"index": 0, "text": "".join(sample.pieces), "token_ids": sample.ids,
                  "prompt_token_ids": sample.prompt_ids, "finish_reason": sample.finish,
                  "logprobs": _logprobs(sample.pieces, sample.logprobs)}
        return {"id": "cmpl-scripted", "object": "text_completion", "model": self.model,
                "choices": [choice], "usage": _usage(sample)}

    async def stream_events(self, sample: Sample) -> AsyncIterator[bytes]:
        """A streamed answer's SSE events, one sampled id per chunk."""
        head = {"id": "cmpl-scripted", "object": "text_completion", "model": self.model}
        last = len(sample.ids) - 1
        for n, (token, piece, logprob) in enumerate(zip(sample.ids, sample.pieces,
                                                        sample.logprobs, strict=True)):
            choice = {"index": 0, "text": piece, "token_ids": [token],
                      "prompt_token_ids": sample.prompt_ids if n == 0 else None,
                      "finish_reason": sample.finish if n == last else None,
                      "logprobs": _logprobs([piece], [logprob])}
            yield _event({**head, "choices": [choice]})
        if not sample.ids:  # nothing sampled: the finish still comes, with the prompt ids
            yield _event({**head, "choices": [{
                "index": 0, "text": "", "token_ids": [], "finish_reason": sample.finish,
                "prompt_token_ids": sample.prompt_ids}]})
        yield _event({**head, "choices": [], "usage": _usage(sample)})
        yield b"data: [DONE]\n\n"


def _logprobs(pieces: list[str], values: list[float]) -> dict[str, Any]:
    offsets, at = [], 0
    for piece in pieces:
        offsets.append(at)
        at += len(piece)
    return {"tokens": pieces, "token_logprobs": values, "text_offset": offsets,
            "top_logprobs": None}


def _usage(sample: Sample) -> dict[str, int]:
    return {"prompt_tokens": len(sample.prompt_ids), "completion_tokens": len(sample.ids),
            "total_tokens": len(sample.prompt_ids) + len(sample.ids)}


def _event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def _error(message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "BadRequestError",
                                   "code": 400}}, 400)
