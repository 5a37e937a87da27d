"""Anthropic Messages: `POST /v1/messages` (streamed and not) and `/v1/messages/count_tokens`.

Decisions that shape the round trip (a harness resends its history verbatim, and parsing it
must give back exactly the canonical parts that were sampled):

- `tool_use.input` <-> `ToolCall.arguments`: the wire carries an object, the canonical form
  JSON text. Parsing encodes `input` compactly (no spaces, keys in the order sent, non-ASCII
  as UTF-8; msgspec's encoder), so arguments the engine produced in that form come back
  byte for byte. Other spacing is not recoverable from this wire (the tool_use id is, so the
  app can restore the exact text from the store). Arguments that are not a JSON object
  (truncated by max_tokens, say) are never replaced by an invented `{}`: they are sent as
  `{"_raw_arguments": text}` and that shape parses back to the same text.
- Thinking signatures: the proxy emits `hrl1.<digest of the text>` (plus a packed payload
  when the reasoning carries an encrypted blob). A signature of that form whose digest
  matches the text parses back to the signature-less canonical `Reasoning`; any other
  signature (or an edited text) is kept verbatim. The digest is an integrity marker, not a
  secret.
- `output_config.effort` (Anthropic's effort knob) of low/medium/high becomes
  `reasoning_effort`; the `thinking` config itself has no faithful effort equivalent, so it
  is only recorded in `extra` (the engine's default applies).
"""

from __future__ import annotations

from typing import Any

import msgspec

from harnessrl.errors import HarnessRLError
from harnessrl.proxy.dialects.anthropic_request import (
    RAW_ARGUMENTS,
    parse_request,
    sign,
)
from harnessrl.proxy.dialects.base import (
    NO_OPTIONS,
    CountTokens,
    Dialect,
    Generate,
    ListModels,
    ReplyContext,
    Route,
    StreamOptions,
    fixed,
)
from harnessrl.proxy.wire import nesting, sse
from harnessrl.types import (
    ChatRequest,
    Chunk,
    Completion,
    EngineEvent,
    Finished,
    Image,
    Part,
    Reasoning,
    ReasoningDelta,
    Started,
    Text,
    TextDelta,
    ToolCall,
    ToolCallDelta,
)

name = "anthropic"
id_prefix = "msg_"

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode


# ------------------------------------------------------------------ response
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
         "content_filter": "refusal", "error": "end_turn"}


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = _decode(arguments)
    except (msgspec.DecodeError, RecursionError):
        value = None
    if nesting.could_be_deep(arguments) and nesting.depth_over(value):
        value = None  # past the nesting limit a client must keep to: sent as text
    return value if isinstance(value, dict) else {RAW_ARGUMENTS: arguments}


def _image_block(image: Image) -> dict[str, Any]:
    head, sep, data = image.url.partition(";base64,")
    if sep and head.startswith("data:"):
        return {"type": "image", "source": {"type": "base64", "media_type": head[5:],
                                            "data": data}}
    return {"type": "image", "source": {"type": "url", "url": image.url}}


def _content_block(part: Part) -> dict[str, Any]:
    if isinstance(part, Text):
        return {"type": "text", "text": part.text}
    if isinstance(part, Reasoning):
        if part.redacted:
            return {"type": "redacted_thinking", "data": part.encrypted or ""}
        return {"type": "thinking", "thinking": part.text, "signature": sign(part)}
    if isinstance(part, ToolCall):
        return {"type": "tool_use", "id": part.id, "name": part.name,
                "input": _input(part.arguments)}
    if isinstance(part, Image):
        return _image_block(part)
    raise TypeError(f"an assistant reply cannot hold {type(part).__name__}")


def _usage(completion: Completion) -> dict[str, int]:
    if completion.usage is not None:
        return {"input_tokens": completion.usage.prompt_tokens,
                "output_tokens": completion.usage.completion_tokens}
    # Anthropic always sends usage; fall back to the exact ids we hold, else 0.
    prompt, output = completion.tokens.prompt_ids, completion.tokens.completion_ids
    return {"input_tokens": len(prompt or ()), "output_tokens": len(output or ())}


def render_completion(completion: Completion, ctx: ReplyContext) -> bytes:
    return _encode({
        "id": ctx.id, "type": "message", "role": "assistant", "model": ctx.model,
        "content": [_content_block(p) for p in completion.parts],
        "stop_reason": _STOP[completion.finish_reason], "stop_sequence": None,
        "usage": _usage(completion),
    })


_TEXT_BLOCK = ("text", 0)


class StreamEncoder:
    """Engine events in, Messages SSE events out: one content block per run of one kind."""

    media_type = "text/event-stream"

    def __init__(self, request: ChatRequest, ctx: ReplyContext) -> None:
        self._ctx = ctx
        self._started = False
        self._open: tuple[str, int] | None = None  # (kind, tool index) of the open block
        self._blocks = 0
        self._tool_blocks: dict[int, int] = {}  # tool call index -> content block index
        self._thinking: list[str] = []
        self._output_ids = 0
        self._text_head = b""  # the open text block's delta event, up to the text

    def _event(self, kind: str, **payload: Any) -> bytes:
        return sse.encode(_encode({"type": kind, **payload}), kind)

    def _start(self, prompt_ids: tuple[int, ...] | None) -> bytes:
        # input_tokens is the client's usage field, not training data: a count is enough,
        # 0 when the engine did not say (message_delta corrects it from Finished.usage).
        self._started = True
        message = {"id": self._ctx.id, "type": "message", "role": "assistant",
                   "model": self._ctx.model, "content": [], "stop_reason": None,
                   "stop_sequence": None,
                   "usage": {"input_tokens": len(prompt_ids or ()), "output_tokens": 0}}
        return self._event("message_start", message=message) + self._event("ping")

    def feed(self, event: EngineEvent) -> bytes:
        if type(event) is Chunk and len(event.deltas) == 1 and self._open == _TEXT_BLOCK:
            delta = event.deltas[0]  # a token of the open text block: the common chunk
            if type(delta) is TextDelta and delta.text:
                self._output_ids += len(event.token_ids or ())
                return self._text_head + _encode(delta.text) + b"}}\n\n"
        if isinstance(event, Started):
            return self._start(event.prompt_ids)
        out = b"" if self._started else self._start(None)
        if isinstance(event, Chunk):
            self._output_ids += len(event.token_ids or ())
            return out + b"".join(self._delta(d) for d in event.deltas)
        return out + self._finish(event)

    def _delta(self, d: TextDelta | ReasoningDelta | ToolCallDelta) -> bytes:
        if isinstance(d, ToolCallDelta):
            return self._tool_delta(d)
        if not d.text:
            return b""
        if isinstance(d, TextDelta):
            if self._open == _TEXT_BLOCK:  # the common case, preformatted: one per token
                return self._text_head + _encode(d.text) + b"}}\n\n"
            out = self._switch(_TEXT_BLOCK, {"type": "text", "text": ""})
            self._text_head = (b'event: content_block_delta\ndata: {"type":"content_block_delta",'
                               b'"index":%d,"delta":{"type":"text_delta","text":'
                               % (self._blocks - 1))
            return out + self._block_delta({"type": "text_delta", "text": d.text})
        out = self._switch(("thinking", 0), {"type": "thinking", "thinking": "", "signature": ""})
        self._thinking.append(d.text)
        return out + self._block_delta({"type": "thinking_delta", "thinking": d.text})

    def _tool_delta(self, d: ToolCallDelta) -> bytes:
        out = b""
        if d.index not in self._tool_blocks:
            out = self._switch(("tool_use", d.index), {"type": "tool_use", "id": d.id or "",
                                                      "name": d.name or "", "input": {}})
            self._tool_blocks[d.index] = self._blocks - 1
        if d.arguments:  # a piece for an earlier, closed call goes to its own block index
            out += self._event("content_block_delta", index=self._tool_blocks[d.index],
                               delta={"type": "input_json_delta", "partial_json": d.arguments})
        return out

    def _switch(self, kind: tuple[str, int], block: dict[str, Any]) -> bytes:
        if self._open == kind:
            return b""
        out = self._close()
        self._open = kind
        self._blocks += 1
        return out + self._event("content_block_start", index=self._blocks - 1,
                                 content_block=block)

    def _block_delta(self, delta: dict[str, Any]) -> bytes:
        return self._event("content_block_delta", index=self._blocks - 1, delta=delta)

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        out = b""
        if self._open[0] == "thinking":
            signature = sign(Reasoning("".join(self._thinking)))
            out = self._block_delta({"type": "signature_delta", "signature": signature})
            self._thinking = []
        self._open = None
        return out + self._event("content_block_stop", index=self._blocks - 1)

    def _finish(self, event: Finished) -> bytes:
        usage = {"output_tokens": self._output_ids}
        if event.usage is not None:
            usage = {"input_tokens": event.usage.prompt_tokens,
                     "output_tokens": event.usage.completion_tokens}
        delta = {"stop_reason": _STOP[event.finish_reason], "stop_sequence": None}
        return (self._close() + self._event("message_delta", delta=delta, usage=usage)
                + self._event("message_stop"))

    def error(self, err: HarnessRLError) -> bytes:
        return sse.encode(_encode(_error_body(err)), "error")


def stream_encoder(request: ChatRequest, ctx: ReplyContext,
                   _options: StreamOptions = NO_OPTIONS) -> StreamEncoder:
    return StreamEncoder(request, ctx)


def render_models(models: list[str]) -> bytes:
    data = [{"type": "model", "id": m, "display_name": m, "created_at": "1970-01-01T00:00:00Z"}
            for m in models]
    return _encode({"data": data, "has_more": False,
                    "first_id": models[0] if models else None,
                    "last_id": models[-1] if models else None})


def parse_count_tokens(body: Any, *, model: str | None = None) -> ChatRequest:
    """`/v1/messages/count_tokens` takes a Messages body without `max_tokens`."""
    if isinstance(body, dict) and body.get("max_tokens") is None:
        body = {**body, "max_tokens": 1}  # not sampled: only the prompt is counted
    return parse_request(body, model=model)


def count_tokens_body(n: int) -> bytes:
    """The `/v1/messages/count_tokens` answer; the app counts with the served tokenizer."""
    return _encode({"input_tokens": n})


# ------------------------------------------------------------------ errors
# The status is always `err.status` (ours, e.g. 503 for a down engine); only the type
# names Anthropic's category. A down engine is "overloaded" in Anthropic's terms, but we
# keep 503 rather than claim 529: both are retried by the SDK and Claude Code.
_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "too_large": "request_too_large",
    "rate_limit": "rate_limit_error",
    "step_cap": "invalid_request_error",
    "engine_error": "api_error",
    "engine_unavailable": "overloaded_error",
    "timeout": "timeout_error",
    "internal": "api_error",
}


def _error_body(err: HarnessRLError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _ERROR_TYPES[err.kind], "message": err.message}}


def render_error(err: HarnessRLError) -> tuple[int, bytes]:
    return err.status, _encode(_error_body(err))


# Claude Code lists models at OpenAI's path, and says which API it speaks by the header.
DIALECT = Dialect(
    name=name, id_prefix=id_prefix,
    routes=(Route("POST", "/v1/messages", fixed(Generate())),
            Route("POST", "/v1/messages/count_tokens", fixed(CountTokens())),
            Route("GET", "/v1/models", fixed(ListModels()), header="anthropic-version"),
            Route("GET", "/models", fixed(ListModels()), header="anthropic-version")),
    parse_request=parse_request, render_completion=render_completion,
    stream_encoder=stream_encoder, render_models=render_models, render_error=render_error,
    parse_count_tokens=parse_count_tokens, count_tokens_body=count_tokens_body)
