"""Gemini generateContent: `POST .../v1beta/models/{model}:generateContent`,
`:streamGenerateContent` (SSE with `alt=sse`, else a streamed JSON array), `:countTokens`.

Round-trip schemes (what the proxy emits comes back as the same canonical parts):
- Call ids: a `functionCall` always carries the canonical `ToolCall.id` (even ""). A call
  sent without `id` gets `<name>_<n>`, n = the number of `functionCall` parts before it in
  `contents`, so ids stay stable as the conversation grows. A `functionResponse` without
  `id` takes the oldest unanswered call of the same name (Gemini matches by name and order).
- Thought signatures: reasoning with no signature is emitted with `OWN_SIGNATURE`, which
  parses back to `signature=None`; any other signature passes through unchanged. A
  signature on a non-thought part (Gemini puts them on `functionCall` parts) becomes a
  `Reasoning("", signature)` right before that part, and is re-attached when rendered.
- Arguments: `args` is an object on the wire, so parsing encodes it as
  `json.dumps(args, ensure_ascii=False)` (the form vLLM's tool parsers produce); other
  spacing does not survive the client. "" is sent without `args`; arguments that are not a
  JSON object cannot be expressed and are also sent without `args` (never invented).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import msgspec

from harnessrl.errors import HarnessRLError, NotFound
from harnessrl.proxy.dialects.base import (
    CountTokens,
    Dialect,
    Generate,
    ListModels,
    Operation,
    ReplyContext,
    Route,
    StreamOptions,
    fixed,
)
from harnessrl.proxy.dialects.gemini_request import OWN_SIGNATURE, parse_request
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
    Text,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolResult,
    Usage,
)

name = "gemini"
id_prefix = ""  # Gemini replies carry `responseId`, not a prefixed id.

_encode = msgspec.json.Encoder().encode


# ------------------------------------------------------------------ response
# Gemini has no tool-call finish reason: a turn that ends in calls finishes with STOP.
_FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP",
           "content_filter": "SAFETY", "error": "OTHER"}


def _parts(parts: tuple[Part, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, part in enumerate(parts):
        after = parts[i + 1] if i + 1 < len(parts) else None
        if _is_carried_signature(part, after):
            continue  # rendered on the next part, as Gemini carries it
        rendered = _PART_JSON[type(part)](part)
        before = parts[i - 1] if i else None
        if before is not None and _is_carried_signature(before, part):
            rendered["thoughtSignature"] = before.signature  # type: ignore[union-attr]
        out.append(rendered)
    return out


def _is_carried_signature(part: Part, after: Part | None) -> bool:
    """A bare signature before a non-thought part: parse made it from that part's field."""
    return (isinstance(part, Reasoning) and not part.text and part.signature is not None
            and after is not None and not isinstance(after, Reasoning | ToolResult))


def _thought(part: Reasoning) -> dict[str, Any]:
    # `encrypted`/`redacted` have no Gemini form; the text and signature are what return.
    return {"text": part.text, "thought": True,
            "thoughtSignature": part.signature if part.signature is not None else OWN_SIGNATURE}


def _image(part: Image) -> dict[str, Any]:
    head, sep, data = part.url.partition(";base64,")
    if part.url.startswith("data:") and sep:
        return {"inlineData": {"mimeType": head[len("data:"):], "data": data}}
    return {"fileData": {"fileUri": part.url}}


def _function_call(part: ToolCall) -> dict[str, Any]:
    call: dict[str, Any] = {"name": part.name}
    args = _args(part.arguments)
    if args is not None:
        call["args"] = args
    call["id"] = part.id
    return {"functionCall": call}


def _args(arguments: str) -> dict[str, Any] | None:
    """The arguments object, or None when they are not one (sent without `args`)."""
    try:
        value = json.loads(arguments) if arguments else None
    except (ValueError, RecursionError):
        return None
    if nesting.could_be_deep(arguments) and nesting.depth_over(value):
        return None  # past the nesting limit a client must keep to
    return value if isinstance(value, dict) else None


_PART_JSON = {
    Text: lambda p: {"text": p.text},
    Reasoning: _thought,
    Image: _image,
    ToolCall: _function_call,
}


def _usage(usage: Usage | None) -> dict[str, int] | None:
    if usage is None:
        return None
    return {"promptTokenCount": usage.prompt_tokens,
            "candidatesTokenCount": usage.completion_tokens,
            "totalTokenCount": usage.prompt_tokens + usage.completion_tokens}


def _response(ctx: ReplyContext, parts: list[dict[str, Any]], finish: str | None = None,
              usage: Usage | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}}
    if finish is not None:
        candidate["finishReason"] = finish
    candidate["index"] = 0
    body: dict[str, Any] = {"candidates": [candidate]}
    metadata = _usage(usage)
    if metadata is not None:
        body["usageMetadata"] = metadata
    body["modelVersion"], body["responseId"] = ctx.model, ctx.id
    return body


def render_completion(completion: Completion, ctx: ReplyContext) -> bytes:
    return _encode(_response(ctx, _parts(completion.parts), _FINISH[completion.finish_reason],
                             completion.usage))


_PARTS_HEAD = b'{"candidates":[{"content":{"role":"model","parts":['


class StreamEncoder:
    """Engine events in, `GenerateContentResponse` chunks out: SSE `data:` events (`alt=sse`)
    or the pieces of one JSON array. Each chunk holds only the new parts; a function call
    is buffered and sent whole (Gemini does not stream arguments)."""

    def __init__(self, request: ChatRequest, ctx: ReplyContext, *, sse: bool = True) -> None:
        self._ctx = ctx
        self._sse = sse
        self.media_type = "text/event-stream" if sse else "application/json"
        self._first = True
        self._calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]
        # A chunk of new parts is this head, the parts, this tail: `_response` preformatted.
        self._tail = (b']},"index":0}],"modelVersion":' + _encode(ctx.model)
                      + b',"responseId":' + _encode(ctx.id) + b"}")

    def _frame(self, body: dict[str, Any], last: bool = False) -> bytes:
        data = _encode(body)
        if self._sse:
            return sse.encode(data)
        out = (b"[" if self._first else b",\r\n") + data + (b"]" if last else b"")
        self._first = False
        return out

    def _parts_frame(self, parts: list[dict[str, Any]]) -> bytes:
        """`_frame(_response(ctx, parts))`, with the parts the only thing encoded."""
        data = _PARTS_HEAD + _encode(parts)[1:-1] + self._tail
        if self._sse:
            return b"data: " + data + b"\n\n"
        out = (b"[" if self._first else b",\r\n") + data
        self._first = False
        return out

    def _flush(self, keep: int | None = None) -> list[dict[str, Any]]:
        done = [i for i in sorted(self._calls) if i != keep]
        return [_function_call(ToolCall(*self._calls.pop(i))) for i in done]

    def feed(self, event: EngineEvent) -> bytes:
        if type(event) is Chunk and len(event.deltas) == 1 and type(event.deltas[0]) is TextDelta:
            text = event.deltas[0].text  # a token of text: `_parts_frame([{"text": text}])`
            if text:
                data = _PARTS_HEAD + b'{"text":' + _encode(text) + b"}" + self._tail
                if self._sse:
                    return b"data: " + data + b"\n\n"
                out = (b"[" if self._first else b",\r\n") + data
                self._first = False
                return out
        if isinstance(event, Chunk):
            parts: list[dict[str, Any]] = []
            for delta in event.deltas:
                parts.extend(self._delta(delta))
            return self._parts_frame(parts) if parts else b""
        if isinstance(event, Finished):
            body = _response(self._ctx, self._flush(), _FINISH[event.finish_reason],
                             event.usage)
            return self._frame(body, last=True)
        return b""  # Started: Gemini has no opening event

    def _delta(self, delta: TextDelta | ReasoningDelta | ToolCallDelta) -> list[dict[str, Any]]:
        if isinstance(delta, ToolCallDelta):
            flushed = self._flush(keep=delta.index) if delta.index not in self._calls else []
            call = self._calls.setdefault(delta.index, ["", "", ""])
            call[0] = delta.id or call[0]
            call[1] = delta.name or call[1]
            call[2] += delta.arguments
            return flushed
        if not delta.text:
            return []
        if isinstance(delta, ReasoningDelta):
            return [{"text": delta.text, "thought": True, "thoughtSignature": OWN_SIGNATURE}]
        return [{"text": delta.text}]

    def error(self, err: HarnessRLError) -> bytes:
        return self._frame(_error_body(err), last=True)


def stream_encoder(request: ChatRequest, ctx: ReplyContext, *, sse: bool = True
                   ) -> StreamEncoder:
    """`sse=True` for `?alt=sse`; without it Gemini streams one JSON array."""
    return StreamEncoder(request, ctx, sse=sse)


def _stream_encoder(request: ChatRequest, ctx: ReplyContext, options: StreamOptions
                    ) -> StreamEncoder:
    return StreamEncoder(request, ctx, sse=options.get("sse", True))


_METHODS = ["generateContent", "streamGenerateContent", "countTokens"]


def render_models(models: list[str]) -> bytes:
    return _encode({"models": [{"name": f"models/{m}", "baseModelId": m, "version": "1",
                                "displayName": m, "supportedGenerationMethods": _METHODS}
                               for m in models]})


def parse_count_tokens(body: Any, *, model: str | None = None) -> ChatRequest:
    """`:countTokens` takes `contents` alone or a whole `generateContentRequest`."""
    if isinstance(body, dict) and isinstance(body.get("generateContentRequest"), dict):
        body = body["generateContentRequest"]
    return parse_request(body, model=model)


def count_tokens_body(total: int) -> bytes:
    return _encode({"totalTokens": total})


# ------------------------------------------------------------------ errors
_ERROR_STATUS = {
    "invalid_request": "INVALID_ARGUMENT",
    "authentication": "UNAUTHENTICATED",
    "permission": "PERMISSION_DENIED",
    "not_found": "NOT_FOUND",
    "too_large": "INVALID_ARGUMENT",
    "rate_limit": "RESOURCE_EXHAUSTED",
    "step_cap": "FAILED_PRECONDITION",  # Google's 400 for "not in a state to do this"
    "engine_error": "INTERNAL",
    "engine_unavailable": "UNAVAILABLE",
    "timeout": "DEADLINE_EXCEEDED",
    "internal": "INTERNAL",
}


def _error_body(err: HarnessRLError) -> dict[str, Any]:
    return {"error": {"code": err.status, "message": err.message,
                      "status": _ERROR_STATUS[err.kind]}}


def render_error(err: HarnessRLError) -> tuple[int, bytes]:
    return err.status, _encode(_error_body(err))


# ------------------------------------------------------------------ routes
_CALLS = {"generateContent": False, "streamGenerateContent": True}  # method -> streamed


def _target(path: Mapping[str, Any], query: Mapping[str, str]) -> Operation:
    """Gemini puts model and method in one path segment: `models/<model>:<method>`."""
    model, _, method = str(path["target"]).partition(":")
    if method == "countTokens":
        return CountTokens(model)
    if method not in _CALLS:
        raise NotFound(f"unknown method {method!r}: use generateContent, "
                       "streamGenerateContent or countTokens")
    return Generate(model, _CALLS[method], {"sse": query.get("alt") == "sse"})


# `/v1` is google-genai's default version, whose models list shares OpenAI's path: a
# request there is Gemini's when it carries Gemini's API-key header.
DIALECT = Dialect(
    name=name, id_prefix=id_prefix,
    routes=(Route("GET", "/v1beta/models", fixed(ListModels())),
            Route("POST", "/v1beta/models/{target}", _target),
            Route("POST", "/v1/models/{target}", _target),
            Route("GET", "/v1/models", fixed(ListModels()), header="x-goog-api-key"),
            Route("GET", "/models", fixed(ListModels()), header="x-goog-api-key")),
    parse_request=parse_request, render_completion=render_completion,
    stream_encoder=_stream_encoder, render_models=render_models, render_error=render_error,
    parse_count_tokens=parse_count_tokens, count_tokens_body=count_tokens_body)
