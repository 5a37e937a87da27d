"""The dialect interface, and the small helpers the dialects share for validation.

A dialect is pure: it turns native JSON into a `ChatRequest`, a `Completion` into native
JSON bytes, engine events into native SSE bytes, and errors into the native error shape.
It also names its routes and what a request to each asks for, so the app serves a dialect
without knowing anything about it. Each dialect module exports one `DIALECT`; the registry
in this package's `__init__` lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Protocol

from harnessrl.errors import HarnessRLError, InvalidRequest, NotFound
from harnessrl.types import ChatRequest, Completion, EngineEvent, Turn


@dataclass(frozen=True, slots=True)
class ReplyContext:
    """What a rendered reply needs besides the completion: the names the client expects."""

    id: str
    created: int
    model: str


# What a route tells a dialect's stream encoder besides the request (Gemini: `sse`).
StreamOptions = Mapping[str, Any]
NO_OPTIONS: StreamOptions = MappingProxyType({})


class StreamEncoder(Protocol):
    media_type: str  # of the streamed body: SSE, or Gemini's JSON array

    def feed(self, event: EngineEvent) -> bytes: ...

    def error(self, err: HarnessRLError) -> bytes: ...


# ------------------------------------------------------------------ routes
@dataclass(frozen=True, slots=True)
class Generate:
    """Sample a reply. `model` and `stream` are set when the route says them (Gemini's
    path does); `options` go to the dialect's stream encoder."""

    model: str | None = None
    stream: bool | None = None
    options: StreamOptions = field(default_factory=lambda: NO_OPTIONS)


@dataclass(frozen=True, slots=True)
class CountTokens:
    """Count a prompt's tokens; not a model call, so not a turn."""

    model: str | None = None


@dataclass(frozen=True, slots=True)
class ListModels:
    """List the served models."""


Operation = Generate | CountTokens | ListModels
# What a request asks for, from its path parameters and its query.
Resolve = Callable[[Mapping[str, Any], Mapping[str, str]], Operation]


def fixed(operation: Operation) -> Resolve:
    """A route that always asks for the same thing."""
    return lambda _path, _query: operation


@dataclass(frozen=True, slots=True)
class Route:
    """A path a dialect serves, at the root and under `/r/<key>`.

    `header` marks a route on a path another dialect owns: it serves the requests that
    carry that header (three APIs list models at `GET /v1/models`, each in its own shape).
    """

    method: str
    path: str
    resolve: Resolve
    header: str | None = None


# ------------------------------------------------------------------ the interface
class ParseRequest(Protocol):
    def __call__(self, body: Any, /, *, model: str | None = None,
                 stream: bool | None = None) -> ChatRequest: ...


class ParseCountTokens(Protocol):
    def __call__(self, body: Any, /, *, model: str | None = None) -> ChatRequest: ...


class MakeStreamEncoder(Protocol):
    def __call__(self, request: ChatRequest, ctx: ReplyContext, options: StreamOptions,
                 /) -> StreamEncoder: ...


def _no_previous(_request: ChatRequest) -> str | None:
    return None


def _as_sent(request: ChatRequest, _previous: Turn | None) -> ChatRequest:
    return request


def _no_counting(_body: Any, /, *, model: str | None = None) -> ChatRequest:
    raise NotFound("this API does not count tokens")


def _no_count_body(_count: int) -> bytes:
    raise NotFound("this API does not count tokens")


@dataclass(frozen=True, slots=True)
class Dialect:
    """One wire API: its names, its routes, and the pure functions that speak it."""

    name: str
    id_prefix: str  # of the reply ids it hands out (`chatcmpl-`, `msg_`, `resp_`)
    routes: tuple[Route, ...]
    # `model` and `stream` are given when the route says them (Gemini's path does).
    parse_request: ParseRequest
    render_completion: Callable[[Completion, ReplyContext], bytes]
    stream_encoder: MakeStreamEncoder
    render_models: Callable[[list[str]], bytes]
    render_error: Callable[[HarnessRLError], tuple[int, bytes]]
    parse_count_tokens: ParseCountTokens = field(default=_no_counting)
    count_tokens_body: Callable[[int], bytes] = field(default=_no_count_body)
    # A dialect whose requests continue an earlier reply by its id (Responses'
    # `previous_response_id`) names that reply, and `expand_history` gets its stored turn
    # (None when there is none) to fill the history in. The store lookup is the app's:
    # the dialect stays free of I/O. By default a request carries its whole history.
    previous_reply: Callable[[ChatRequest], str | None] = field(default=_no_previous)
    expand_history: Callable[[ChatRequest, Turn | None], ChatRequest] = field(
        default=_as_sent)


# ------------------------------------------------------------------ validation helpers
ToolMode = Literal["auto", "none", "required"]  # `ToolChoice.mode`, for the dialects' tables


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


def lookup(value: Any) -> str:
    """A value as a lookup key for a table of names: null, or a list or object sent where
    a name belongs (a wrong type), becomes a key that matches nothing, not an unhashable
    crash."""
    return value if isinstance(value, str) else "\0"


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
