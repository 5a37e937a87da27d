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

import base64
import hashlib
from collections.abc import Callable
from typing import Any

import msgspec

from harnessrl.errors import HarnessRLError, InvalidRequest
from harnessrl.proxy import nesting, sse
from harnessrl.proxy.dialects.base import (
    NO_OPTIONS,
    CountTokens,
    Dialect,
    Generate,
    ListModels,
    ReplyContext,
    Route,
    StreamOptions,
    ToolMode,
    expect,
    fixed,
    lookup,
    number,
    optional,
    stop_list,
)
from harnessrl.types import (
    ChatRequest,
    Chunk,
    Completion,
    EngineEvent,
    Finished,
    Image,
    Message,
    Part,
    Reasoning,
    ReasoningDelta,
    Role,
    Sampling,
    Started,
    Text,
    TextDelta,
    Tool,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolResult,
)

name = "anthropic"
id_prefix = "msg_"

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode

# Fields this module maps; everything else (thinking, metadata, output_config,
# context_management, beta fields) is kept in `ChatRequest.extra`.
_MAPPED = frozenset({
    "model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k",
    "stop_sequences", "stream", "tools", "tool_choice",
})
_ROLES: dict[str, Role] = {"user": "user", "assistant": "assistant", "system": "system"}
_EFFORTS = frozenset({"low", "medium", "high"})  # what OpenAI-style engines accept
_RAW_ARGUMENTS = "_raw_arguments"
_SIGNATURE_PREFIX = "hrl1."


# ------------------------------------------------------------------ request
def parse_request(body: Any, *, model: str | None = None, stream: bool | None = None
                  ) -> ChatRequest:
    body = expect(body, dict, "body")
    messages = expect(body.get("messages"), list, "messages")
    if not messages:
        raise InvalidRequest("`messages` must hold at least one message", param="messages")
    if body.get("max_tokens") is None:
        raise InvalidRequest("`max_tokens` is required by the Messages API", param="max_tokens")
    tools, unmapped = _parse_tools(optional(body, "tools", list) or [])
    extra = {k: v for k, v in body.items() if k not in _MAPPED}
    if unmapped:
        extra["unmapped_tools"] = unmapped
    system = _parse_system(body.get("system"))
    tool_choice, parallel = _parse_tool_choice(body.get("tool_choice"))
    return ChatRequest(
        model=model or expect(body.get("model", ""), str, "model"),
        messages=system + tuple(_parse_message(m, f"messages[{i}]")
                                for i, m in enumerate(messages)),
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        sampling=Sampling(
            temperature=number(body, "temperature"),
            top_p=number(body, "top_p"),
            top_k=optional(body, "top_k", int),
            max_tokens=expect(body["max_tokens"], int, "max_tokens"),
            stop=stop_list(body.get("stop_sequences"), "stop_sequences"),
        ),
        stream=bool(optional(body, "stream", bool)) if stream is None else stream,
        reasoning_effort=_effort(body.get("output_config")),
        extra=extra,
    )


def _effort(output_config: Any) -> str | None:
    if isinstance(output_config, dict) and lookup(output_config.get("effort")) in _EFFORTS:
        return output_config["effort"]
    return None  # "max" and the like have no engine equivalent: recorded in extra only


def _parse_system(raw: Any) -> tuple[Message, ...]:
    if raw is None:
        return ()
    return (Message("system", tuple(_text_only(raw, "system"))),)


def _text_only(raw: Any, where: str) -> list[Text]:
    if isinstance(raw, str):
        return [Text(raw)]
    blocks = expect(raw, list, where)
    return [_text_block(b, f"{where}[{i}]") for i, b in enumerate(blocks)]


def _text_block(raw: Any, where: str) -> Text:
    raw = expect(raw, dict, where)
    if raw.get("type") != "text":
        raise InvalidRequest(f"`{where}.type` must be 'text' here, got {raw.get('type')!r}",
                             param=f"{where}.type")
    return Text(expect(raw.get("text"), str, f"{where}.text"))


def _parse_message(raw: Any, where: str) -> Message:
    raw = expect(raw, dict, where)
    role = _ROLES.get(lookup(raw.get("role")))
    if role is None:
        raise InvalidRequest(
            f"`{where}.role` must be one of {sorted(_ROLES)}, got {raw.get('role')!r}",
            param=f"{where}.role",
        )
    content = raw.get("content")
    if role == "system":  # Claude Code's mid-conversation system entries: kept in place
        return Message("system", tuple(_text_only(content, f"{where}.content")))
    if isinstance(content, str):
        return Message(role, (Text(content),))
    blocks = expect(content, list, f"{where}.content")
    return Message(role, tuple(_block(b, f"{where}.content[{i}]") for i, b in enumerate(blocks)))


def _block(raw: Any, where: str) -> Part:
    raw = expect(raw, dict, where)
    parse = _BLOCKS.get(lookup(raw.get("type")))
    if parse is None:
        raise InvalidRequest(
            f"`{where}.type` {raw.get('type')!r} is not supported; send one of "
            f"{sorted(_BLOCKS)}", param=f"{where}.type")
    return parse(raw, where)


def _image(raw: dict[str, Any], where: str) -> Image:
    source = expect(raw.get("source"), dict, f"{where}.source")
    kind = source.get("type")
    if kind == "base64":
        media = expect(source.get("media_type"), str, f"{where}.source.media_type")
        data = expect(source.get("data"), str, f"{where}.source.data")
        return Image(f"data:{media};base64,{data}")
    if kind == "url":
        return Image(expect(source.get("url"), str, f"{where}.source.url"))
    raise InvalidRequest(f"`{where}.source.type` must be 'base64' or 'url', got {kind!r}",
                         param=f"{where}.source.type")


def _tool_use(raw: dict[str, Any], where: str) -> ToolCall:
    return ToolCall(
        id=expect(raw.get("id"), str, f"{where}.id"),
        name=expect(raw.get("name"), str, f"{where}.name"),
        arguments=_arguments(expect(raw.get("input", {}), dict, f"{where}.input")),
    )


def _arguments(value: dict[str, Any]) -> str:
    raw = value.get(_RAW_ARGUMENTS)
    if len(value) == 1 and isinstance(raw, str):
        return raw  # what render_completion sent for arguments that were not an object
    return _encode(value).decode()


def _tool_result(raw: dict[str, Any], where: str) -> ToolResult:
    content = raw.get("content")
    parts: list[Text | Image] = []
    if isinstance(content, str):
        parts = [Text(content)]
    elif content is not None:
        for i, item in enumerate(expect(content, list, f"{where}.content")):
            part = _block(item, f"{where}.content[{i}]")
            if not isinstance(part, Text | Image):
                raise InvalidRequest(f"`{where}.content[{i}]` must be a text or image block",
                                     param=f"{where}.content[{i}].type")
            parts.append(part)
    return ToolResult(
        call_id=expect(raw.get("tool_use_id"), str, f"{where}.tool_use_id"),
        content=tuple(parts),
        is_error=bool(optional(raw, "is_error", bool, f"{where}.")),
    )


def _thinking(raw: dict[str, Any], where: str) -> Reasoning:
    text = expect(raw.get("thinking"), str, f"{where}.thinking")
    return _unsign(text, optional(raw, "signature", str, f"{where}."))


def _redacted(raw: dict[str, Any], where: str) -> Reasoning:
    return Reasoning("", encrypted=expect(raw.get("data"), str, f"{where}.data"), redacted=True)


_BLOCKS: dict[str, Callable[[dict[str, Any], str], Part]] = {
    "text": _text_block,
    "image": _image,
    "tool_use": _tool_use,
    "tool_result": _tool_result,
    "thinking": _thinking,
    "redacted_thinking": _redacted,
}


def _parse_tools(raw: list[Any]) -> tuple[tuple[Tool, ...], list[Any]]:
    tools: list[Tool] = []
    unmapped: list[Any] = []
    for i, item in enumerate(raw):
        item = expect(item, dict, f"tools[{i}]")
        if item.get("type", "custom") not in ("custom", None):
            unmapped.append(item)  # server tools (web_search, bash_...): recorded, not offered
            continue
        tools.append(Tool(
            name=expect(item.get("name"), str, f"tools[{i}].name"),
            description=optional(item, "description", str, f"tools[{i}]."),
            parameters=optional(item, "input_schema", dict, f"tools[{i}]."),
        ))
    return tuple(tools), unmapped


_TOOL_CHOICE_MODES: dict[str, ToolMode] = {
    "auto": "auto", "any": "required", "none": "none", "tool": "required"}


def _parse_tool_choice(raw: Any) -> tuple[ToolChoice | None, bool | None]:
    if raw is None:
        return None, None
    raw = expect(raw, dict, "tool_choice")
    mode = _TOOL_CHOICE_MODES.get(lookup(raw.get("type")))
    if mode is None:
        raise InvalidRequest("`tool_choice.type` must be one of 'auto', 'any', 'tool', 'none', "
                             f"got {raw.get('type')!r}", param="tool_choice.type")
    forced = expect(raw.get("name"), str, "tool_choice.name") if raw["type"] == "tool" else None
    disable = optional(raw, "disable_parallel_tool_use", bool, "tool_choice.")
    return ToolChoice(mode, forced), None if disable is None else not disable


# ------------------------------------------------------------------ signatures
def _digest(text: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()[:18]).decode()


def _sign(r: Reasoning) -> str:
    if r.encrypted is None and r.signature is not None:
        return r.signature  # someone else's signature: handed back untouched
    signature = _SIGNATURE_PREFIX + _digest(r.text)
    if r.encrypted is not None:  # no Anthropic field for it: packed behind the digest
        packed = _encode([r.signature, r.encrypted])
        signature += "." + base64.urlsafe_b64encode(packed).decode()
    return signature


def _unsign(text: str, signature: str | None) -> Reasoning:
    if signature is None or not signature.startswith(_SIGNATURE_PREFIX):
        return Reasoning(text, signature)
    digest, _, packed = signature[len(_SIGNATURE_PREFIX):].partition(".")
    if digest != _digest(text):
        return Reasoning(text, signature)  # the text was edited: keep what was sent
    if not packed:
        return Reasoning(text)
    try:
        original, encrypted = _decode(base64.urlsafe_b64decode(packed), type=tuple[str | None, str])
    except (ValueError, msgspec.DecodeError):
        return Reasoning(text, signature)
    return Reasoning(text, original, encrypted)


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
    return value if isinstance(value, dict) else {_RAW_ARGUMENTS: arguments}


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
        return {"type": "thinking", "thinking": part.text, "signature": _sign(part)}
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
            out = self._switch(("text", 0), {"type": "text", "text": ""})
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
            signature = _sign(Reasoning("".join(self._thinking)))
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
