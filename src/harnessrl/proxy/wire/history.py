"""Checks and repairs on a canonical conversation before it reaches the engine. Pure.

Harnesses send the whole history back each turn. Two things about it matter for training:
every tool result must answer a call that is in the conversation, and a call the model
made must come back as the exact text it sampled. Dialects whose wire carries arguments
as a JSON object (Anthropic `input`, Gemini `args`) cannot keep the model's spacing, so
the call's text is restored from what this rollout issued under the same id, if the
two are the same JSON. A call's argument text is JSON inside a string, which the body's
nesting check does not see, so it is checked here against the same limit.
"""

from __future__ import annotations

import json

import msgspec

from harnessrl.errors import InvalidRequest
from harnessrl.proxy.wire import nesting
from harnessrl.types import ChatRequest, Message, ToolCall, ToolResult


def check_tool_results(request: ChatRequest) -> None:
    called: set[str] = set()
    for i, message in enumerate(request.messages):
        for part in message.parts:
            if isinstance(part, ToolCall):
                called.add(part.id)
            elif isinstance(part, ToolResult) and part.call_id not in called:
                raise InvalidRequest(
                    f"message {i} has a tool result for call id {part.call_id!r}, but no "
                    "earlier assistant message made a call with that id", param="messages")


def check_arguments(request: ChatRequest, issued: dict[str, str]) -> None:
    """A 400 for a call whose argument text nests past the limit, unless it is the text
    this rollout issued under that id (the model's own, already served once)."""
    for i, message in enumerate(request.messages):
        for part in message.parts:
            if (isinstance(part, ToolCall) and issued.get(part.id) != part.arguments
                    and nesting.text_too_deep(part.arguments)):
                raise InvalidRequest(
                    f"message {i}: the arguments of tool call {part.id!r} are JSON nested "
                    f"more than {nesting.MAX_DEPTH} levels deep; this proxy accepts at most "
                    f"{nesting.MAX_DEPTH}", param="messages")


def restore_arguments(request: ChatRequest, issued: dict[str, str]) -> ChatRequest:
    """`request` with each call's arguments replaced by the issued text when equal as JSON."""
    if not issued:
        return request
    changed = False
    messages: list[Message] = []
    for message in request.messages:
        parts = tuple(_restored(p, issued) for p in message.parts)
        changed = changed or parts != message.parts
        messages.append(msgspec.structs.replace(message, parts=parts))
    return msgspec.structs.replace(request, messages=tuple(messages)) if changed else request


def _restored(part: object, issued: dict[str, str]) -> object:
    if not isinstance(part, ToolCall):
        return part
    original = issued.get(part.id)
    if original is None or original == part.arguments:
        return part
    if _same_json(original, part.arguments):
        return msgspec.structs.replace(part, arguments=original)
    return part


def _same_json(a: str, b: str) -> bool:
    try:
        return json.loads(a) == json.loads(b)
    except (ValueError, RecursionError):  # the model's own text may nest past the limit
        return False
