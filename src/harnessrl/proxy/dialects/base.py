"""What every dialect module provides, and the small helpers they share for validation.

A dialect is pure: it turns native JSON into a `ChatRequest`, a `Completion` into native
JSON bytes, engine events into native SSE bytes, and errors into the native error shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from harnessrl.errors import HarnessRLError, InvalidRequest
from harnessrl.types import ChatRequest, Completion, EngineEvent


@dataclass(frozen=True, slots=True)
class ReplyContext:
    """What a rendered reply needs besides the completion: the names the client expects."""

    id: str
    created: int
    model: str


class StreamEncoder(Protocol):
    def feed(self, event: EngineEvent) -> bytes: ...

    def error(self, err: HarnessRLError) -> bytes: ...


class Dialect(Protocol):
    """Implemented by each module in this package (the module itself is the dialect)."""

    name: str
    id_prefix: str

    def parse_request(self, body: Any, *, model: str | None = None,
                      stream: bool | None = None) -> ChatRequest:
        """`model` and `stream` are given when the route says them (Gemini's path does)."""
        ...

    def render_completion(self, completion: Completion, ctx: ReplyContext) -> bytes: ...

    def stream_encoder(self, request: ChatRequest, ctx: ReplyContext) -> StreamEncoder: ...

    def render_models(self, models: list[str]) -> bytes: ...

    def render_error(self, err: HarnessRLError) -> tuple[int, bytes]: ...


# ------------------------------------------------------------------ validation helpers
def expect(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    """`value` if it has the wanted JSON type, else a 400 naming the field and the type.
    An integer field takes 64-bit integers: JSON allows any size, the engine does not."""
    if isinstance(value, kind) and not (isinstance(value, bool) and bool not in _as_tuple(kind)):
        if kind is int and not isinstance(value, bool):
            return integer(value, where)
        return value
    raise InvalidRequest(
        f"`{where}` must be {_type_names(kind)}, got {_json_type(value)}", param=where
    )


_INT64 = (-(2**63), 2**63 - 1)


def integer(value: int, where: str) -> int:
    if not _INT64[0] <= value <= _INT64[1]:
        raise InvalidRequest(f"`{where}` must be an integer from -2**63 to 2**63-1, got one "
                             "outside that range", param=where)
    return value


def to_float(value: int | float, where: str) -> float:
    """A JSON number as a float; an integer too large for one is a 400, not an overflow."""
    try:
        return float(value)
    except OverflowError:
        raise InvalidRequest(f"`{where}` is too large a number", param=where) from None


def optional(body: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str = "") -> Any:
    value = body.get(key)
    if value is None:
        return None
    return expect(value, kind, f"{where}{key}")


def number(body: dict[str, Any], key: str) -> float | None:
    value = optional(body, key, (int, float))
    return None if value is None else to_float(value, key)


def lookup(value: Any) -> str | None:
    """A value as a lookup key for a table of names: a list or object sent where a name
    belongs (a wrong type) becomes a key that matches nothing, not an unhashable crash."""
    return value if isinstance(value, str) else None if value is None else "\0"


def stop_list(value: Any, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    items = expect(value, list, where)
    return tuple(expect(item, str, f"{where}[{i}]") for i, item in enumerate(items))


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


_JSON_NAMES = {dict: "an object", list: "an array", str: "a string", int: "an integer",
               float: "a number", bool: "a boolean"}


def _type_names(kind: type | tuple[type, ...]) -> str:
    names = [_JSON_NAMES.get(k, k.__name__) for k in _as_tuple(kind)]
    if names == ["an integer", "a number"]:
        return "a number"
    return " or ".join(names)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    for kind in (bool, dict, list, str, int, float):
        if isinstance(value, kind):
            return _JSON_NAMES[kind]
    return type(value).__name__
