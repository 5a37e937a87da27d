"""How deeply nested a JSON value a client may send. Pure.

The decoders refuse nesting only where the interpreter's recursion limit (about 1,000
frames, minus however deep the caller's stack already is) runs out, so what they accept
depends on where they are called from, and a value one of them accepted could still make
a later step (re-encoding for the engine, rendering a template, converting a schema, the
trace viewer) run out of stack. A fixed limit well below that, checked at the boundary,
makes the rule the same everywhere and leaves every later step room. Real harness bodies
nest a few dozen levels.
"""

from __future__ import annotations

import itertools
from typing import Any

from harnessrl.errors import InvalidRequest

MAX_DEPTH = 512


def depth_over(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether a decoded JSON value nests arrays and objects more than `limit` deep (a
    scalar is depth 0, `[]` depth 1). Iterative: the check itself cannot run out of stack."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def could_be_deep(text: str | bytes, limit: int = MAX_DEPTH) -> bool:
    """False when `text` holds too few brackets to nest past `limit`: the cheap test that
    spares nearly every body the walk."""
    if isinstance(text, str):
        return text.count("[") + text.count("{") > limit
    return text.count(b"[") + text.count(b"{") > limit


def check_body(body: Any, raw: bytes, what: str = "the body") -> None:
    """A 400 when a decoded request body nests past the limit."""
    if could_be_deep(raw) and depth_over(body):
        raise InvalidRequest(f"{what} is nested more than {MAX_DEPTH} levels deep; "
                             f"this proxy accepts at most {MAX_DEPTH}")


def text_too_deep(text: str) -> bool:
    """Whether JSON text (a tool call's arguments) nests past the limit. Read for its
    brackets, not decoded: the same answer for text that is not valid JSON, and no
    decoder to run out of stack on the way."""
    return could_be_deep(text) and bracket_depth(text.encode("utf-8", "surrogatepass")) > (
        MAX_DEPTH)


_OPEN_CLOSE = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))


def bracket_depth(text: bytes) -> int:
    """How deep `[` and `{` nest outside the strings of JSON text (of text that is not
    JSON, the same reading). Escapes go first, so the quotes left delimit strings."""
    plain = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    skeleton = b"".join(plain.split(b'"')[::2]).translate(_OPEN_CLOSE, _NOT_BRACKETS)
    return max(itertools.accumulate(1 if c == 40 else -1 for c in skeleton), default=0)


def too_deep_error(what: str) -> InvalidRequest:
    """The request error for a value a decoder could not follow to its end."""
    return InvalidRequest(f"{what} is nested too deeply to parse; this proxy accepts at "
                          f"most {MAX_DEPTH} levels")
