"""OpenAI Responses requests parsed into the canonical `ChatRequest`, the history a
`previous_response_id` names, and the reasoning seal (see `openai_responses`)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

import msgspec

from harnessrl.errors import InvalidRequest, NotFound
from harnessrl.proxy.dialects import openai_common
from harnessrl.proxy.dialects.base import (
    expect,
    lookup,
    number,
    optional,
)
from harnessrl.types import (
    ChatRequest,
    Completion,
    Image,
    Message,
    Reasoning,
    Role,
    Sampling,
    Text,
    Tool,
    ToolCall,
    ToolResult,
    Turn,
)

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode



# Fields this module maps; everything else (store, include, previous_response_id,
# prompt_cache_key, client_metadata, text, ...) is kept in `ChatRequest.extra`.
MAPPED = frozenset({
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "stream",
    "temperature", "top_p", "max_output_tokens", "reasoning",
})
_ROLES: dict[str, Role] = {"system": "system", "developer": "system", "user": "user",
                           "assistant": "assistant"}


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
    extra = {k: v for k, v in body.items() if k not in MAPPED}
    optional(body, "previous_response_id", str)  # the app resolves it; the type must hold
    if unmapped:
        extra["unmapped_tools"] = unmapped
    if rest := {k: v for k, v in reasoning.items() if k != "effort"}:
        extra["reasoning"] = rest
    return ChatRequest(
        model=model or expect(body.get("model", ""), str, "model"),
        messages=messages,
        tools=tools,
        tool_choice=openai_common.parse_tool_choice(body.get("tool_choice"), nested=False),
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


def seal(reasoning: Reasoning) -> str:
    """The canonical reasoning, encoded (not encrypted) so it can come back exactly."""
    return _SEAL + base64.urlsafe_b64encode(_encode(reasoning)).decode()


def _unseal(value: str) -> Reasoning | None:
    if not value.startswith(_SEAL):
        return None
    try:
        return _reasoning_decoder.decode(base64.urlsafe_b64decode(value[len(_SEAL):]))
    except (binascii.Error, ValueError, msgspec.DecodeError):
        return None  # looks like ours but is not: keep it opaque

