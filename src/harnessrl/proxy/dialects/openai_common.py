"""What the two OpenAI dialects (Chat Completions and Responses) share on the wire: the
error shape and the models list. Not a dialect itself."""

from __future__ import annotations

from typing import Any

import msgspec

from harnessrl.errors import HarnessRLError

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
