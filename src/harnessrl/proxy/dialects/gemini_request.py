"""Gemini generateContent requests parsed into the canonical `ChatRequest` (the round-trip
schemes for call ids, thought signatures and arguments are in `gemini`'s docstring)."""

from __future__ import annotations

import base64
import json
from collections import deque
from typing import Any

from harnessrl.errors import InvalidRequest
from harnessrl.proxy.dialects.base import (
    expect,
    integer,
    lookup,
    optional,
    stop_list,
    to_float,
)
from harnessrl.proxy.dialects.gemini_tools import parse_tool_config, parse_tools
from harnessrl.types import (
    ChatRequest,
    Image,
    Message,
    Part,
    Reasoning,
    Role,
    Sampling,
    Text,
    ToolCall,
    ToolResult,
)

# 21 bytes, so the base64 has no padding and no URL-unsafe characters to be rewritten.
OWN_SIGNATURE = base64.b64encode(b"harnessrl/reasoning/1").decode()

_MAPPED = frozenset({"contents", "systemInstruction", "tools", "toolConfig",
                     "generationConfig"})
_ROLES: dict[str, Role] = {"user": "user", "model": "assistant"}
# Part keys that only annotate a part; they are accepted and not mapped.
_PART_META = frozenset({"thought", "thoughtSignature", "videoMetadata", "partMetadata",
                        "mediaResolution"})


# ------------------------------------------------------------------ request
def parse_request(body: Any, *, model: str | None = None, stream: bool | None = None
                  ) -> ChatRequest:
    body = expect(body, dict, "body")
    contents = expect(body.get("contents"), list, "contents")
    if not contents:
        raise InvalidRequest("`contents` must hold at least one content", param="contents")
    extra = {k: v for k, v in body.items() if k not in _MAPPED}
    messages = _system(body.get("systemInstruction")) + _Conversation().parse(contents)
    tools = parse_tools(optional(body, "tools", list) or [], extra)
    config = optional(body, "generationConfig", dict) or {}
    return ChatRequest(
        model=model or "",
        messages=tuple(messages),
        tools=tools,
        tool_choice=parse_tool_config(optional(body, "toolConfig", dict), extra),
        sampling=_parse_sampling(config, extra),
        stream=bool(stream),
        reasoning_effort=_reasoning_effort(extra.get("thinkingConfig")),
        extra=extra,
    )


def _system(raw: Any) -> list[Message]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [Message("system", (Text(raw),))]
    raw = expect(raw, dict, "systemInstruction")
    parts = expect(raw.get("parts"), list, "systemInstruction.parts")
    texts = [expect(expect(p, dict, f"systemInstruction.parts[{i}]").get("text"), str,
                    f"systemInstruction.parts[{i}].text") for i, p in enumerate(parts)]
    return [Message("system", tuple(Text(t) for t in texts))]


class _Conversation:
    """Parses `contents` in order, so that calls without ids get stable positional ids."""

    def __init__(self) -> None:
        self._calls = 0
        self._pending: dict[str, deque[str]] = {}

    def parse(self, contents: list[Any]) -> list[Message]:
        messages: list[Message] = []
        for i, raw in enumerate(contents):
            messages.extend(self._content(raw, f"contents[{i}]"))
        return messages

    def _content(self, raw: Any, where: str) -> list[Message]:
        raw = expect(raw, dict, where)
        sent = raw.get("role")
        role = _ROLES.get("user" if sent is None else lookup(sent))  # no role is the user's
        if role is None:
            raise InvalidRequest(f"`{where}.role` must be 'user' or 'model', got {sent!r}",
                                 param=f"{where}.role")
        parts = expect(raw.get("parts"), list, f"{where}.parts")
        if not parts:
            raise InvalidRequest(f"`{where}.parts` must hold at least one part",
                                 param=f"{where}.parts")
        parsed = [self._part(p, f"{where}.parts[{j}]", role) for j, p in enumerate(parts)]
        if role == "assistant":
            return [Message("assistant", tuple(x for group in parsed for x in group))]
        # A user turn may mix function responses and text: one tool message per result,
        # other parts grouped in order into user messages.
        messages: list[Message] = []
        for group in parsed:
            for part in group:
                if isinstance(part, ToolResult):
                    messages.append(Message("tool", (part,)))
                elif messages and messages[-1].role == "user":
                    messages[-1] = Message("user", (*messages[-1].parts, part))
                else:
                    messages.append(Message("user", (part,)))
        return messages

    def _part(self, raw: Any, where: str, role: str) -> list[Part]:
        raw = expect(raw, dict, where)
        kinds = [k for k in raw if k not in _PART_META]
        if len(kinds) != 1 or kinds[0] not in _PART_KINDS:
            raise InvalidRequest(
                f"`{where}` has {sorted(kinds) or 'no data'}; send exactly one of "
                f"{sorted(_PART_KINDS)}", param=where)
        kind = kinds[0]
        if kind in _ROLE_OF_KIND and _ROLE_OF_KIND[kind] != role:
            raise InvalidRequest(f"`{where}.{kind}` belongs in a "
                                 f"'{_WIRE_ROLE[_ROLE_OF_KIND[kind]]}' content", param=where)
        signature = optional(raw, "thoughtSignature", str, f"{where}.")
        if kind == "text" and raw.get("thought") is True:
            text = expect(raw["text"], str, f"{where}.text")
            return [Reasoning(text, None if signature == OWN_SIGNATURE else signature)]
        part = _PART_KINDS[kind](self, raw[kind], f"{where}.{kind}")
        if signature is not None and signature != OWN_SIGNATURE:
            return [Reasoning("", signature), part]
        return [part]

    def _call(self, raw: Any, where: str) -> ToolCall:
        raw = expect(raw, dict, where)
        fn = expect(raw.get("name"), str, f"{where}.name")
        call_id = optional(raw, "id", str, f"{where}.")
        call_id = f"{fn}_{self._calls}" if call_id is None else call_id
        self._calls += 1
        self._pending.setdefault(fn, deque()).append(call_id)
        args = optional(raw, "args", dict, f"{where}.")
        return ToolCall(call_id, fn, "" if args is None else json.dumps(args, ensure_ascii=False))

    def _response(self, raw: Any, where: str) -> ToolResult:
        raw = expect(raw, dict, where)
        fn = expect(raw.get("name"), str, f"{where}.name")
        response = expect(raw.get("response", {}), dict, f"{where}.response")
        call_id = optional(raw, "id", str, f"{where}.")
        pending = self._pending.get(fn) or deque()
        if call_id is None:
            if not pending:
                raise InvalidRequest(f"`{where}` answers a call to {fn!r} that was never made "
                                     "(no earlier unanswered functionCall of that name)",
                                     param=where)
            call_id = pending.popleft()
        elif call_id in pending:
            pending.remove(call_id)
        media = [_media(p, f"{where}.parts[{i}]")
                 for i, p in enumerate(optional(raw, "parts", list, f"{where}.") or [])]
        content = (Text(json.dumps(response, ensure_ascii=False)), *media)
        return ToolResult(call_id, content, is_error=set(response) == {"error"})


def _inline(raw: Any, where: str) -> Image:
    raw = expect(raw, dict, where)
    mime = expect(raw.get("mimeType"), str, f"{where}.mimeType")
    return Image(f"data:{mime};base64,{expect(raw.get('data'), str, f'{where}.data')}")


def _file(raw: Any, where: str) -> Image:
    return Image(expect(expect(raw, dict, where).get("fileUri"), str, f"{where}.fileUri"))


def _media(raw: Any, where: str) -> Image:
    raw = expect(raw, dict, where)
    if "inlineData" in raw:
        return _inline(raw["inlineData"], f"{where}.inlineData")
    if "fileData" in raw:
        return _file(raw["fileData"], f"{where}.fileData")
    raise InvalidRequest(f"`{where}` must hold `inlineData` or `fileData`", param=where)


_PART_KINDS = {
    "text": lambda _c, raw, where: Text(expect(raw, str, where)),
    "inlineData": lambda _c, raw, where: _inline(raw, where),
    "fileData": lambda _c, raw, where: _file(raw, where),
    "functionCall": _Conversation._call,
    "functionResponse": _Conversation._response,
}
_ROLE_OF_KIND = {"functionCall": "assistant", "functionResponse": "user"}
_WIRE_ROLE = {"assistant": "model", "user": "user"}


# ------------------------------------------------------------------ generationConfig
_SAMPLING_KEYS = {"temperature": "temperature", "topP": "top_p", "topK": "top_k",
                  "maxOutputTokens": "max_tokens", "seed": "seed",
                  "presencePenalty": "presence_penalty", "frequencyPenalty": "frequency_penalty"}
_INTEGER_KEYS = frozenset({"topK", "maxOutputTokens", "seed"})


def _parse_sampling(config: dict[str, Any], extra: dict[str, Any]) -> Sampling:
    where = "generationConfig."
    count = optional(config, "candidateCount", int, where)
    if count is not None and count != 1:
        raise InvalidRequest("`generationConfig.candidateCount` must be 1: each call is one "
                             "turn of a rollout", param="generationConfig.candidateCount")
    values: dict[str, Any] = {}
    for key, field in _SAMPLING_KEYS.items():
        value = optional(config, key, (int, float), where)
        if value is not None and key in _INTEGER_KEYS:
            if value != int(value):
                raise InvalidRequest(f"`{where}{key}` must be an integer, got {value}",
                                     param=f"{where}{key}")
            value = integer(int(value), f"{where}{key}")
        elif value is not None:
            value = to_float(value, f"{where}{key}")
        values[field] = value
    values["stop"] = stop_list(config.get("stopSequences"), f"{where}stopSequences")
    if "thinkingConfig" in config:
        extra["thinkingConfig"] = expect(config["thinkingConfig"], dict,
                                         f"{where}thinkingConfig")
    rest = {k: v for k, v in config.items()
            if k not in _SAMPLING_KEYS and k not in {"candidateCount", "stopSequences",
                                                     "thinkingConfig"}}
    if rest:
        extra["generationConfig"] = rest
    return Sampling(**values)


def _reasoning_effort(thinking: Any) -> str | None:
    level = thinking.get("thinkingLevel") if isinstance(thinking, dict) else None
    return level.lower() if isinstance(level, str) else None
