"""OpenAI Chat Completions: `POST /v1/chat/completions`, streamed and not."""

from __future__ import annotations

from typing import Any

import msgspec

from harnessrl.errors import HarnessRLError, InvalidRequest
from harnessrl.proxy.dialects import openai_common
from harnessrl.proxy.dialects.base import (
    NO_OPTIONS,
    Dialect,
    Generate,
    ListModels,
    ReplyContext,
    Route,
    StreamOptions,
    expect,
    fixed,
    lookup,
    number,
    optional,
    stop_list,
)
from harnessrl.proxy.wire import sse
from harnessrl.types import (
    ChatRequest,
    Chunk,
    Completion,
    EngineEvent,
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
    ToolResult,
)

name = "openai_chat"
id_prefix = "chatcmpl-"

_encode = msgspec.json.Encoder().encode

# Fields this module maps; everything else a client sends is kept in `ChatRequest.extra`.
_MAPPED = frozenset({
    "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "stream",
    "temperature", "top_p", "top_k", "min_p", "max_tokens", "max_completion_tokens", "stop",
    "seed", "presence_penalty", "frequency_penalty", "repetition_penalty", "reasoning_effort",
    "n",
})
_ROLES: dict[str, Role] = {"system": "system", "developer": "system", "user": "user",
                           "assistant": "assistant", "tool": "tool"}


# ------------------------------------------------------------------ request
def parse_request(body: Any, *, model: str | None = None, stream: bool | None = None
                  ) -> ChatRequest:
    body = expect(body, dict, "body")
    messages = expect(body.get("messages"), list, "messages")
    if not messages:
        raise InvalidRequest("`messages` must hold at least one message", param="messages")
    n = optional(body, "n", int)
    if n is not None and n != 1:
        raise InvalidRequest("`n` must be 1: each call is one turn of a rollout", param="n")
    tools, unmapped = _parse_tools(optional(body, "tools", list) or [])
    extra = {k: v for k, v in body.items() if k not in _MAPPED}
    if unmapped:
        extra["unmapped_tools"] = unmapped
    return ChatRequest(
        model=model or expect(body.get("model", ""), str, "model"),
        messages=tuple(_parse_message(m, f"messages[{i}]") for i, m in enumerate(messages)),
        tools=tools,
        tool_choice=openai_common.parse_tool_choice(body.get("tool_choice"), nested=True),
        parallel_tool_calls=optional(body, "parallel_tool_calls", bool),
        sampling=_parse_sampling(body),
        stream=bool(optional(body, "stream", bool)) if stream is None else stream,
        reasoning_effort=optional(body, "reasoning_effort", str),
        extra=extra,
    )


def _parse_sampling(body: dict[str, Any]) -> Sampling:
    max_tokens = optional(body, "max_completion_tokens", int)
    if max_tokens is None:
        max_tokens = optional(body, "max_tokens", int)
    return Sampling(
        temperature=number(body, "temperature"),
        top_p=number(body, "top_p"),
        top_k=optional(body, "top_k", int),
        min_p=number(body, "min_p"),
        max_tokens=max_tokens,
        stop=stop_list(body.get("stop"), "stop"),
        seed=optional(body, "seed", int),
        presence_penalty=number(body, "presence_penalty"),
        frequency_penalty=number(body, "frequency_penalty"),
        repetition_penalty=number(body, "repetition_penalty"),
    )


def _parse_message(raw: Any, where: str) -> Message:
    raw = expect(raw, dict, where)
    role = _ROLES.get(lookup(raw.get("role")))
    if role is None:
        raise InvalidRequest(
            f"`{where}.role` must be one of {sorted(_ROLES)}, got {raw.get('role')!r}",
            param=f"{where}.role",
        )
    name_ = optional(raw, "name", str, f"{where}.")
    if role == "tool":
        call_id = expect(raw.get("tool_call_id"), str, f"{where}.tool_call_id")
        content = tuple(_content(raw.get("content"), f"{where}.content"))
        return Message("tool", (ToolResult(call_id, content),), name_)
    parts: list[Part] = []
    reasoning = raw.get("reasoning_content", raw.get("reasoning"))
    if reasoning is not None and role == "assistant":
        parts.append(Reasoning(expect(reasoning, str, f"{where}.reasoning_content")))
    parts.extend(_content(raw.get("content"), f"{where}.content"))
    if role == "assistant":
        calls = optional(raw, "tool_calls", list, f"{where}.") or []
        parts.extend(_parse_tool_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls))
    return Message(role, tuple(parts), name_)


def _content(raw: Any, where: str) -> list[Text | Image]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [Text(raw)]
    items = expect(raw, list, where)
    return [_content_part(item, f"{where}[{i}]") for i, item in enumerate(items)]


def _content_part(raw: Any, where: str) -> Text | Image:
    raw = expect(raw, dict, where)
    kind = raw.get("type")
    if kind == "text":
        return Text(expect(raw.get("text"), str, f"{where}.text"))
    if kind == "image_url":
        image = raw.get("image_url")
        if isinstance(image, str):
            return Image(image)
        image = expect(image, dict, f"{where}.image_url")
        detail = optional(image, "detail", str, f"{where}.image_url.")
        return Image(expect(image.get("url"), str, f"{where}.image_url.url"), detail)
    raise InvalidRequest(
        f"`{where}.type` {kind!r} is not supported; send `text` or `image_url` parts",
        param=f"{where}.type",
    )


def _parse_tool_call(raw: Any, where: str) -> ToolCall:
    raw = expect(raw, dict, where)
    function = expect(raw.get("function"), dict, f"{where}.function")
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):  # some clients send an object; keep it as JSON text
        arguments = _encode(arguments).decode()
    return ToolCall(
        id=expect(raw.get("id", ""), str, f"{where}.id"),
        name=expect(function.get("name"), str, f"{where}.function.name"),
        arguments=arguments,
    )


def _parse_tools(raw: list[Any]) -> tuple[tuple[Tool, ...], list[Any]]:
    tools: list[Tool] = []
    unmapped: list[Any] = []
    for i, item in enumerate(raw):
        item = expect(item, dict, f"tools[{i}]")
        if item.get("type", "function") != "function":
            unmapped.append(item)  # recorded, not offered: we cannot render it faithfully
            continue
        fn = expect(item.get("function"), dict, f"tools[{i}].function")
        tools.append(Tool(
            name=expect(fn.get("name"), str, f"tools[{i}].function.name"),
            description=optional(fn, "description", str, f"tools[{i}].function."),
            parameters=optional(fn, "parameters", dict, f"tools[{i}].function."),
            strict=optional(fn, "strict", bool, f"tools[{i}].function."),
        ))
    return tuple(tools), unmapped


# ------------------------------------------------------------------ response
_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls",
           "content_filter": "content_filter", "error": "stop"}


def _message(parts: tuple[Part, ...]) -> dict[str, Any]:
    text = "".join(p.text for p in parts if isinstance(p, Text))
    reasoning = "".join(p.text for p in parts if isinstance(p, Reasoning))
    calls = [_tool_call_json(p) for p in parts if isinstance(p, ToolCall)]
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_call_json(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def _usage(completion_usage: Any) -> dict[str, int] | None:
    if completion_usage is None:
        return None
    return {"prompt_tokens": completion_usage.prompt_tokens,
            "completion_tokens": completion_usage.completion_tokens,
            "total_tokens": completion_usage.prompt_tokens + completion_usage.completion_tokens}


def render_completion(completion: Completion, ctx: ReplyContext) -> bytes:
    body: dict[str, Any] = {
        "id": ctx.id, "object": "chat.completion", "created": ctx.created, "model": ctx.model,
        "choices": [{"index": 0, "message": _message(completion.parts),
                     "finish_reason": _FINISH[completion.finish_reason], "logprobs": None}],
    }
    usage = _usage(completion.usage)
    if usage is not None:
        body["usage"] = usage
    return _encode(body)


class StreamEncoder:
    """Engine events in, `chat.completion.chunk` SSE bytes out."""

    media_type = "text/event-stream"

    def __init__(self, request: ChatRequest, ctx: ReplyContext) -> None:
        options = request.extra.get("stream_options")
        self._include_usage = isinstance(options, dict) and options.get("include_usage") is True
        self._head = {"id": ctx.id, "object": "chat.completion.chunk", "created": ctx.created,
                      "model": ctx.model}
        # Every chunk shares its head: encode it once, not once per token.
        self._prefix = b"data: " + _encode(self._head)[:-1] + b',"choices":[{"index":0,"delta":'
        self._text = self._prefix + b'{"content":'  # a text token: the common chunk

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        tail = b"null" if finish is None else _encode(finish)
        return (self._prefix + _encode(delta) + b',"finish_reason":' + tail
                + b',"logprobs":null}]}\n\n')

    def feed(self, event: EngineEvent) -> bytes:
        if isinstance(event, Chunk):
            deltas = event.deltas
            if len(deltas) == 1 and type(deltas[0]) is TextDelta:
                return self._text + _encode(deltas[0].text) + _TEXT_TAIL
            # Many tokens of one read (a busy or paced stream): text still preformatted.
            return b"".join([self._text + _encode(d.text) + _TEXT_TAIL if type(d) is TextDelta
                             else self._chunk(_DELTA[type(d)](d)) for d in deltas])
        if isinstance(event, Started):
            return self._chunk({"role": "assistant", "content": ""})
        out = self._chunk({}, _FINISH[event.finish_reason])
        usage = _usage(event.usage)
        if self._include_usage and usage is not None:
            out += sse.encode(_encode({**self._head, "choices": [], "usage": usage}))
        return out + b"data: [DONE]\n\n"

    def error(self, err: HarnessRLError) -> bytes:
        return sse.encode(_encode(openai_common.error_body(err)))


_TEXT_TAIL = b'},"finish_reason":null,"logprobs":null}]}\n\n'
_DELTA = {
    TextDelta: lambda d: {"content": d.text},
    ReasoningDelta: lambda d: {"reasoning_content": d.text},
    ToolCallDelta: lambda d: {"tool_calls": [_tool_call_delta(d)]},
}


def _tool_call_delta(d: ToolCallDelta) -> dict[str, Any]:
    out: dict[str, Any] = {"index": d.index}
    function: dict[str, Any] = {"arguments": d.arguments}
    if d.id is not None:
        out["id"], out["type"] = d.id, "function"
    if d.name is not None:
        function["name"] = d.name
    out["function"] = function
    return out


def stream_encoder(request: ChatRequest, ctx: ReplyContext,
                   _options: StreamOptions = NO_OPTIONS) -> StreamEncoder:
    return StreamEncoder(request, ctx)


# The error shape and models list are OpenAI's, shared with the other OpenAI dialect.
render_error = openai_common.render_error
render_models = openai_common.render_models

# Served with and without the `/v1` prefix: clients differ in whether their base URL has it.
DIALECT = Dialect(
    name=name, id_prefix=id_prefix,
    routes=(Route("POST", "/v1/chat/completions", fixed(Generate())),
            Route("POST", "/chat/completions", fixed(Generate())),
            Route("GET", "/v1/models", fixed(ListModels())),
            Route("GET", "/models", fixed(ListModels()))),
    parse_request=parse_request, render_completion=render_completion,
    stream_encoder=stream_encoder, render_models=render_models, render_error=render_error)
