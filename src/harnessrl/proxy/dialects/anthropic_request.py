"""Anthropic Messages requests parsed into the canonical `ChatRequest` (the decisions
that shape the round trip are in `anthropic`'s docstring), and the thinking signatures
the proxy emits and reads back."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from typing import Any

import msgspec

from harnessrl.errors import InvalidRequest
from harnessrl.proxy.dialects.base import (
    ToolMode,
    expect,
    lookup,
    number,
    optional,
    stop_list,
)
from harnessrl.types import (
    ChatRequest,
    Image,
    Message,
    Part,
    Reasoning,
    Role,
    Sampling,
    Text,
    Tool,
    ToolCall,
    ToolChoice,
    ToolResult,
)

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode



# Fields this module maps; everything else (thinking, metadata, output_config,
# context_management, beta fields) is kept in `ChatRequest.extra`.
MAPPED = frozenset({
    "model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k",
    "stop_sequences", "stream", "tools", "tool_choice",
})
_ROLES: dict[str, Role] = {"user": "user", "assistant": "assistant", "system": "system"}
_EFFORTS = frozenset({"low", "medium", "high"})  # what OpenAI-style engines accept
RAW_ARGUMENTS = "_raw_arguments"
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
    extra = {k: v for k, v in body.items() if k not in MAPPED}
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
    raw = value.get(RAW_ARGUMENTS)
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


def sign(r: Reasoning) -> str:
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


