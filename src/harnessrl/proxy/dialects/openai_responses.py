"""OpenAI Responses: `POST /v1/responses`, streamed and not (Codex speaks this).

Reasoning the proxy emits carries `encrypted_content` that is *not* encrypted: it is a
versioned, self-contained encoding of the canonical `Reasoning` (see `_seal`). The proxy
keeps no per-item state, so the only way to give back exactly the reasoning that was
sampled when a harness resends its history (Codex sends `store: false` and relies on
`encrypted_content`) is to carry it inside the item itself. Opaque values that are not
ours (from a real OpenAI response) are kept as `Reasoning.encrypted` untouched.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

import msgspec

from harnessrl.errors import HarnessRLError, InvalidRequest, NotFound
from harnessrl.proxy import sse
from harnessrl.proxy.dialects import openai_common
from harnessrl.proxy.dialects.base import (
    NO_OPTIONS,
    Dialect,
    Generate,
    ReplyContext,
    Route,
    StreamOptions,
    expect,
    fixed,
    lookup,
    number,
    optional,
)
from harnessrl.types import (
    ChatRequest,
    Chunk,
    Completion,
    EngineEvent,
    FinishReason,
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
    Turn,
    Usage,
)

name = "openai_responses"
id_prefix = "resp_"

_encode = msgspec.json.Encoder().encode

# Fields this module maps; everything else (store, include, previous_response_id,
# prompt_cache_key, client_metadata, text, ...) is kept in `ChatRequest.extra`.
_MAPPED = frozenset({
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "stream",
    "temperature", "top_p", "max_output_tokens", "reasoning",
})
_ROLES: dict[str, Role] = {"system": "system", "developer": "system", "user": "user",
                           "assistant": "assistant"}
_TOOL_CHOICE_MODES = frozenset({"auto", "none", "required"})


# ------------------------------------------------------------------ request
def parse_request(body: Any, *, model: str | None = None, stream: bool | None = None
                  ) -> ChatRequest:
    body = expect(body, dict, "body")
    messages = _parse_input(body.get("input"))
    instructions = optional(body, "instructions", str)
    if instructions is not None:
        messages = (Message("system", (Text(instructions),)), *messages)
    tools, unmapped = _parse_tools(optional(body, "tools", list) or [])
    reasoning = optional(body, "reasoning", dict) or {}
    extra = {k: v for k, v in body.items() if k not in _MAPPED}
    optional(body, "previous_response_id", str)  # the app resolves it; the type must hold
    if unmapped:
        extra["unmapped_tools"] = unmapped
    if rest := {k: v for k, v in reasoning.items() if k != "effort"}:
        extra["reasoning"] = rest
    return ChatRequest(
        model=model or expect(body.get("model", ""), str, "model"),
        messages=messages,
        tools=tools,
        tool_choice=_parse_tool_choice(body.get("tool_choice")),
        parallel_tool_calls=optional(body, "parallel_tool_calls", bool),
        sampling=Sampling(temperature=number(body, "temperature"), top_p=number(body, "top_p"),
                          max_tokens=optional(body, "max_output_tokens", int)),
        stream=bool(optional(body, "stream", bool)) if stream is None else stream,
        reasoning_effort=optional(reasoning, "effort", str, "reasoning."),
        extra=extra,
    )


def _parse_input(raw: Any) -> tuple[Message, ...]:
    if isinstance(raw, str):
        if not raw:
            raise InvalidRequest("`input` must not be empty", param="input")
        return (Message("user", (Text(raw),)),)
    items = expect(raw, (str, list), "input")
    if not items:
        raise InvalidRequest("`input` must hold at least one item", param="input")
    messages: list[Message] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        item = expect(item, dict, where)
        kind = item.get("type", "message" if "role" in item else None)
        parse = _ITEMS.get(lookup(kind))
        if parse is None:
            raise InvalidRequest(f"`{where}.type` {kind!r} is not supported; send one of "
                                 f"{sorted(_ITEMS)}", param=f"{where}.type")
        message = parse(item, where)
        # One model turn arrives as several items (reasoning, message, function_call...):
        # they become one assistant message, as the model produced them.
        if message.role == "assistant" and messages and messages[-1].role == "assistant":
            message = Message("assistant", messages.pop().parts + message.parts)
        messages.append(message)
    return tuple(messages)


def _message_item(item: dict[str, Any], where: str) -> Message:
    role = _ROLES.get(lookup(item.get("role")))
    if role is None:
        raise InvalidRequest(
            f"`{where}.role` must be one of {sorted(_ROLES)}, got {item.get('role')!r}",
            param=f"{where}.role")
    return Message(role, tuple(_content(item.get("content"), f"{where}.content")))


def _content(raw: Any, where: str) -> list[Text | Image]:
    if isinstance(raw, str):
        return [Text(raw)]
    items = expect(raw, (str, list), where)
    return [_content_part(item, f"{where}[{i}]") for i, item in enumerate(items)]


def _content_part(raw: Any, where: str) -> Text | Image:
    raw = expect(raw, dict, where)
    kind = raw.get("type")
    if kind in ("input_text", "output_text"):
        return Text(expect(raw.get("text"), str, f"{where}.text"))
    if kind == "refusal":
        return Text(expect(raw.get("refusal"), str, f"{where}.refusal"))
    if kind == "input_image" and raw.get("image_url") is not None:
        detail = optional(raw, "detail", str, f"{where}.")
        return Image(expect(raw["image_url"], str, f"{where}.image_url"), detail)
    if kind == "input_image":
        raise InvalidRequest(f"`{where}.image_url` is required: images by `file_id` cannot be "
                             "fetched by the proxy", param=f"{where}.image_url")
    raise InvalidRequest(f"`{where}.type` {kind!r} is not supported; send `input_text`, "
                         "`output_text`, `refusal` or `input_image` parts", param=f"{where}.type")


def _function_call_item(item: dict[str, Any], where: str) -> Message:
    call = ToolCall(id=expect(item.get("call_id"), str, f"{where}.call_id"),
                    name=expect(item.get("name"), str, f"{where}.name"),
                    arguments=expect(item.get("arguments", ""), str, f"{where}.arguments"))
    return Message("assistant", (call,))


def _function_output_item(item: dict[str, Any], where: str) -> Message:
    call_id = expect(item.get("call_id"), str, f"{where}.call_id")
    content = tuple(_content(item.get("output"), f"{where}.output"))
    return Message("tool", (ToolResult(call_id, content),))


def _reasoning_item(item: dict[str, Any], where: str) -> Message:
    sealed = optional(item, "encrypted_content", str, f"{where}.")
    mine = _unseal(sealed) if sealed is not None else None
    if mine is not None:
        return Message("assistant", (mine,))
    # Raw reasoning (`content`) is what the model produced; the summary is second best.
    texts = _texts(item.get("content"), "reasoning_text", f"{where}.content")
    if not texts:
        texts = _texts(item.get("summary"), "summary_text", f"{where}.summary")
    return Message("assistant", (Reasoning("\n\n".join(texts), encrypted=sealed),))


def _texts(raw: Any, kind: str, where: str) -> list[str]:
    if raw is None:
        return []
    out = []
    for i, part in enumerate(expect(raw, list, where)):
        part = expect(part, dict, f"{where}[{i}]")
        if part.get("type") != kind:
            raise InvalidRequest(f"`{where}[{i}].type` must be {kind!r}, got "
                                 f"{part.get('type')!r}", param=f"{where}[{i}].type")
        out.append(expect(part.get("text"), str, f"{where}[{i}].text"))
    return out


_ITEMS: dict[str, Callable[[dict[str, Any], str], Message]] = {
    "message": _message_item,
    "function_call": _function_call_item,
    "function_call_output": _function_output_item,
    "reasoning": _reasoning_item,
}


def _parse_tools(raw: list[Any]) -> tuple[tuple[Tool, ...], list[Any]]:
    tools: list[Tool] = []
    unmapped: list[Any] = []
    for i, item in enumerate(raw):
        item = expect(item, dict, f"tools[{i}]")
        if item.get("type") != "function":
            unmapped.append(item)  # namespace, web_search, custom...: recorded, not offered
            continue
        tools.append(Tool(
            name=expect(item.get("name"), str, f"tools[{i}].name"),
            description=optional(item, "description", str, f"tools[{i}]."),
            parameters=optional(item, "parameters", dict, f"tools[{i}]."),
            strict=optional(item, "strict", bool, f"tools[{i}]."),
        ))
    return tuple(tools), unmapped


def _parse_tool_choice(raw: Any) -> ToolChoice | None:
    if raw is None:
        return None
    if isinstance(raw, str) and raw in _TOOL_CHOICE_MODES:
        return ToolChoice(raw)  # type: ignore[arg-type]
    if isinstance(raw, dict) and raw.get("type") == "function":
        return ToolChoice("required", expect(raw.get("name"), str, "tool_choice.name"))
    raise InvalidRequest("`tool_choice` must be 'auto', 'none', 'required' or "
                         '{"type": "function", "name": ...}', param="tool_choice")


def with_previous(previous: ChatRequest, previous_completion: Completion,
                  current: ChatRequest) -> ChatRequest:
    """`current` continued from an earlier turn named by `previous_response_id`.

    As in the Responses API, the earlier input and output are carried over but its
    instructions are not: the current leading system messages replace the earlier ones.
    """
    def split(messages: tuple[Message, ...]) -> tuple[tuple[Message, ...], tuple[Message, ...]]:
        n = next((i for i, m in enumerate(messages) if m.role != "system"), len(messages))
        return messages[:n], messages[n:]

    system, rest = split(current.messages)
    history = split(previous.messages)[1]
    reply = tuple(p for p in previous_completion.parts
                  if isinstance(p, Text | Reasoning | ToolCall))
    if reply:
        history += (Message("assistant", reply),)
    return msgspec.structs.replace(current, messages=system + history + rest)


def previous_reply(request: ChatRequest) -> str | None:
    """The id of the response this request continues (`previous_response_id`), if any."""
    previous = request.extra.get("previous_response_id")
    return previous if isinstance(previous, str) and previous else None


def expand_history(request: ChatRequest, previous: Turn | None) -> ChatRequest:
    """`request` continued from `previous`, the stored turn `previous_response_id` names."""
    if previous is None or previous.request is None or previous.completion is None:
        raise NotFound(f"previous_response_id {previous_reply(request)!r} is not a finished "
                       "response of this rollout", param="previous_response_id")
    return with_previous(previous.request, previous.completion, request)


# ------------------------------------------------------------------ reasoning seal
_SEAL = "harnessrl.v1."
_reasoning_decoder = msgspec.json.Decoder(Reasoning)


def _seal(reasoning: Reasoning) -> str:
    """The canonical reasoning, encoded (not encrypted) so it can come back exactly."""
    return _SEAL + base64.urlsafe_b64encode(_encode(reasoning)).decode()


def _unseal(value: str) -> Reasoning | None:
    if not value.startswith(_SEAL):
        return None
    try:
        return _reasoning_decoder.decode(base64.urlsafe_b64decode(value[len(_SEAL):]))
    except (binascii.Error, ValueError, msgspec.DecodeError):
        return None  # looks like ours but is not: keep it opaque


# ------------------------------------------------------------------ response
# finish reason -> (status, incomplete reason)
_STATUS: dict[str, tuple[str, str | None]] = {
    "stop": ("completed", None), "tool_calls": ("completed", None),
    "length": ("incomplete", "max_output_tokens"),
    "content_filter": ("incomplete", "content_filter"), "error": ("failed", None),
}
_TERMINAL_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete",
                   "failed": "response.failed"}


def _item_id(kind: str, ctx: ReplyContext, index: int) -> str:
    # Deterministic per response and position, so stream and final object agree.
    return f"{kind}_{ctx.id.removeprefix(id_prefix)}_{index}"


def _output_items(parts: tuple[Part, ...] | list[Part], ctx: ReplyContext,
                  status: str = "completed") -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, Text) and items and items[-1]["type"] == "message":
            items[-1]["content"].append(_text_part(part.text))  # one message, several parts
        elif isinstance(part, Text | Reasoning | ToolCall):
            items.append(_ITEM_JSON[type(part)](part, _item_id(_KIND[type(part)], ctx,
                                                                len(items)), status))
    return items


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _summary(text: str) -> list[dict[str, str]]:
    return [{"type": "summary_text", "text": text}] if text else []


_KIND = {Text: "msg", Reasoning: "rs", ToolCall: "fc"}
_ITEM_JSON: dict[type, Any] = {
    Text: lambda p, id_, st: {"id": id_, "type": "message", "status": st, "role": "assistant",
                              "content": [_text_part(p.text)]},
    Reasoning: lambda p, id_, st: {"id": id_, "type": "reasoning", "status": st,
                                   "summary": _summary(p.text), "encrypted_content": _seal(p)},
    ToolCall: lambda p, id_, st: {"id": id_, "type": "function_call", "status": st,
                                  "call_id": p.id, "name": p.name, "arguments": p.arguments},
}


def _usage(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {"input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


def _response(ctx: ReplyContext, status: str, output: list[dict[str, Any]],
              usage: Usage | None = None) -> dict[str, Any]:
    # The fields the SDK's `Response` model requires, with neutral values: the proxy does
    # not echo the request (Codex's tool list alone is tens of kilobytes per event).
    return {"id": ctx.id, "object": "response", "created_at": ctx.created, "status": status,
            "error": None, "incomplete_details": None, "instructions": None, "model": ctx.model,
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": _usage(usage)}


def _finished(ctx: ReplyContext, parts: tuple[Part, ...] | list[Part], finish: FinishReason,
              usage: Usage | None) -> dict[str, Any]:
    status, reason = _STATUS[finish]
    body = _response(ctx, status, _output_items(parts, ctx, "completed" if reason is None
                                                else "incomplete"), usage)
    if reason is not None:
        body["incomplete_details"] = {"reason": reason}
    if status == "failed":
        body["error"] = {"code": "server_error", "message": "the engine stopped with an error"}
    return body


def render_completion(completion: Completion, ctx: ReplyContext) -> bytes:
    return _encode(_finished(ctx, completion.parts, completion.finish_reason, completion.usage))


class StreamEncoder:
    """Engine events in, Responses SSE events (each with a `sequence_number`) out.

    Each delta kind opens an output item (reasoning, message, or the `index`-th function
    call); a delta of another kind closes it first, so items come out in part order.
    """

    media_type = "text/event-stream"

    def __init__(self, request: ChatRequest, ctx: ReplyContext) -> None:
        self._ctx = ctx
        self._seq = 0
        self._parts: list[Part] = []
        self._open: Any = None  # the key of the open item: "rs", "msg" or a tool index

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse.encode(_encode(data), kind)

    def _where(self) -> dict[str, Any]:
        index = len(self._parts) - 1
        kind = _KIND[type(self._parts[-1])]
        return {"item_id": _item_id(kind, self._ctx, index), "output_index": index}

    def feed(self, event: EngineEvent) -> bytes:
        if isinstance(event, Started):
            start = _response(self._ctx, "in_progress", [])
            return (self._event("response.created", response=start)
                    + self._event("response.in_progress", response=start))
        if isinstance(event, Chunk):
            return b"".join(self._delta(d) for d in event.deltas)
        body = _finished(self._ctx, self._parts, event.finish_reason, event.usage)
        return self._close() + self._event(_TERMINAL_EVENT[body["status"]], response=body)

    def _delta(self, delta: Any) -> bytes:
        if not isinstance(delta, ToolCallDelta) and not delta.text:
            return b""
        key = delta.index if isinstance(delta, ToolCallDelta) else _KIND[_PART[type(delta)]]
        out = b""
        if key != self._open:
            out = self._close() + self._start(delta)
            self._open = key
        return out + _ON_DELTA[type(delta)](self, delta)

    def _start(self, delta: Any) -> bytes:
        if isinstance(delta, ToolCallDelta):
            self._parts.append(ToolCall(delta.id or "", delta.name or "", ""))
        else:
            self._parts.append(_PART[type(delta)](""))
        item = _output_items(self._parts[-1:], self._ctx, "in_progress")[0]
        item["id"] = self._where()["item_id"]
        if item["type"] == "message":
            item["content"] = []
        if item["type"] == "reasoning":
            item["summary"] = []
            del item["encrypted_content"]
        out = self._event("response.output_item.added", output_index=len(self._parts) - 1,
                          item=item)
        return out + _ON_START.get(item["type"], lambda s: b"")(self)

    def _append(self, text: str) -> None:
        last = self._parts[-1]
        self._parts[-1] = msgspec.structs.replace(last, **{_GROWS[type(last)]: getattr(
            last, _GROWS[type(last)]) + text})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        part, where = self._parts[-1], self._where()
        out = _ON_CLOSE[type(part)](self, part, where)
        item = _output_items([part], self._ctx)[0]
        item["id"] = where["item_id"]
        return out + self._event("response.output_item.done",
                                 output_index=where["output_index"], item=item)

    def error(self, err: HarnessRLError) -> bytes:
        # `response.failed` ends the lifecycle for clients that follow it (Codex); the
        # `error` event after it carries an `error` object, which makes the openai SDK
        # raise `APIError` with our message instead of ending quietly.
        body = _response(self._ctx, "failed", _output_items(self._parts, self._ctx,
                                                            "incomplete"))
        body["error"] = {"code": _FAILED_CODES.get(err.kind, "server_error"),
                         "message": err.message}
        inner = openai_common.error_body(err)["error"]
        return (self._event("response.failed", response=body)
                + self._event("error", code=inner["code"], message=err.message,
                              param=err.param, error=inner))


_PART: dict[type, Any] = {TextDelta: Text, ReasoningDelta: Reasoning}
_GROWS = {Text: "text", Reasoning: "text", ToolCall: "arguments"}
_FAILED_CODES = {"rate_limit": "rate_limit_exceeded", "invalid_request": "invalid_prompt"}

_ON_START = {
    "message": lambda s: s._event("response.content_part.added", **s._where(), content_index=0,
                                  part=_text_part("")),
    "reasoning": lambda s: s._event("response.reasoning_summary_part.added", **s._where(),
                                    summary_index=0, part={"type": "summary_text", "text": ""}),
}


def _on_text(s: StreamEncoder, d: TextDelta) -> bytes:
    s._append(d.text)
    return s._event("response.output_text.delta", **s._where(), content_index=0, delta=d.text,
                    logprobs=[])


def _on_reasoning(s: StreamEncoder, d: ReasoningDelta) -> bytes:
    s._append(d.text)
    return s._event("response.reasoning_summary_text.delta", **s._where(), summary_index=0,
                    delta=d.text)


def _on_tool(s: StreamEncoder, d: ToolCallDelta) -> bytes:
    if not d.arguments:
        return b""
    s._append(d.arguments)
    return s._event("response.function_call_arguments.delta", **s._where(), delta=d.arguments)


_ON_DELTA: dict[type, Any] = {TextDelta: _on_text, ReasoningDelta: _on_reasoning,
                              ToolCallDelta: _on_tool}


def _close_text(s: StreamEncoder, p: Text, where: dict[str, Any]) -> bytes:
    return (s._event("response.output_text.done", **where, content_index=0, text=p.text,
                     logprobs=[])
            + s._event("response.content_part.done", **where, content_index=0,
                       part=_text_part(p.text)))


def _close_reasoning(s: StreamEncoder, p: Reasoning, where: dict[str, Any]) -> bytes:
    return (s._event("response.reasoning_summary_text.done", **where, summary_index=0,
                     text=p.text)
            + s._event("response.reasoning_summary_part.done", **where, summary_index=0,
                       part={"type": "summary_text", "text": p.text}))


def _close_tool(s: StreamEncoder, p: ToolCall, where: dict[str, Any]) -> bytes:
    return s._event("response.function_call_arguments.done", **where, name=p.name,
                    arguments=p.arguments)


_ON_CLOSE: dict[type, Any] = {Text: _close_text, Reasoning: _close_reasoning,
                              ToolCall: _close_tool}


def stream_encoder(request: ChatRequest, ctx: ReplyContext,
                   _options: StreamOptions = NO_OPTIONS) -> StreamEncoder:
    return StreamEncoder(request, ctx)


# The error shape and models list are OpenAI's, shared with the other OpenAI dialect.
render_error = openai_common.render_error
render_models = openai_common.render_models

DIALECT = Dialect(
    name=name, id_prefix=id_prefix,
    routes=(Route("POST", "/v1/responses", fixed(Generate())),
            Route("POST", "/responses", fixed(Generate()))),
    parse_request=parse_request, render_completion=render_completion,
    stream_encoder=stream_encoder, render_models=render_models, render_error=render_error,
    previous_reply=previous_reply, expand_history=expand_history)
