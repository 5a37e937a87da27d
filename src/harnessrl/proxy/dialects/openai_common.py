"""What the two OpenAI dialects (Chat Completions and Responses) share on the wire: the
error shape, the models list and `tool_choice`. Not a dialect itself."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from harnessrl.errors import HarnessRLError, InvalidRequest
from harnessrl.proxy.dialects.base import expect
from harnessrl.types import ToolChoice

_encode = msgspec.json.Encoder().encode

ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "too_large": "invalid_request_error",
    "rate_limit": "rate_limit_error",
    "step_cap": "invalid_request_error",
    "engine_error": "api_error",
    "engine_unavailable": "service_unavailable",
    "timeout": "timeout",
    "internal": "server_error",
}
ERROR_CODES = {"authentication": "invalid_api_key", "not_found": "model_not_found",
               "too_large": "request_too_large", "rate_limit": "rate_limit_exceeded",
               "step_cap": "max_model_calls_exceeded"}


def error_body(err: HarnessRLError) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}`, as OpenAI answers."""
    return {"error": {"message": err.message, "type": ERROR_TYPES[err.kind],
                      "param": err.param, "code": ERROR_CODES.get(err.kind)}}


def render_error(err: HarnessRLError) -> tuple[int, bytes]:
    return err.status, _encode(error_body(err))


def render_models(models: list[str]) -> bytes:
    return _encode({"object": "list", "data": [
        {"id": m, "object": "model", "created": 0, "owned_by": "harnessrl"} for m in models]})


_TOOL_CHOICE_MODES: dict[str, Literal["auto", "none", "required"]] = {
    "auto": "auto", "none": "none", "required": "required"}


def parse_tool_choice(raw: Any, *, nested: bool) -> ToolChoice | None:
    """`tool_choice`: a mode, or one function forced, named at `function.name` (Chat
    Completions, `nested`) or at `name` (Responses)."""
    if raw is None:
        return None
    if isinstance(raw, str) and raw in _TOOL_CHOICE_MODES:
        return ToolChoice(_TOOL_CHOICE_MODES[raw])
    if nested and isinstance(raw, dict) and isinstance(raw.get("function"), dict):
        return ToolChoice("required", expect(raw["function"].get("name"), str,
                                             "tool_choice.function.name"))
    if not nested and isinstance(raw, dict) and raw.get("type") == "function":
        return ToolChoice("required", expect(raw.get("name"), str, "tool_choice.name"))
    shape = '"function": {"name": ...}' if nested else '"name": ...'
    raise InvalidRequest("`tool_choice` must be 'auto', 'none', 'required' or "
                         f'{{"type": "function", {shape}}}', param="tool_choice")
