"""Turns shaped for the page: the conversation as the harness sent it (its own dialect's
message list) and in the canonical form, one turn at a time, showing what each turn added.

A turn's request carries the whole history, so repeating it per turn would grow the page
with the square of the turns; each turn shows only the messages that are new since the
turn before when its history starts with that turn's, and says so when it does not.
Long texts are clipped with an explicit marker; the raw bodies stay one click away.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import msgspec

from harnessrl.errors import HarnessRLError
from harnessrl.proxy.wire import codings
from harnessrl.types import Message, Turn

CLIP = 20_000
RAW_LIMIT = 2_000_000
# Where each dialect keeps its message list in the native request body.
# The most a coded request body is decoded to for the page (a body the proxy refused as a
# decompression bomb stays coded).
DECODED_LIMIT = 64 * 1024 * 1024
NATIVE_LIST = {"openai_chat": "messages", "anthropic": "messages", "openai_responses": "input",
               "gemini": "contents"}


def clip(value: Any, limit: int = CLIP) -> Any:
    """`value` with every string longer than `limit` cut, and the cut said in the text."""
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + f"\n… [clipped by the viewer: {len(value) - limit} more characters]"
    if isinstance(value, list):
        return [clip(v, limit) for v in value]
    if isinstance(value, dict):
        return {k: clip(v, limit) for k, v in value.items()}
    return value


def _native(turn: Turn) -> tuple[str | None, Any]:
    """The native body's message list (key and value); (None, None) if the body is not
    JSON or has no list where its dialect keeps one."""
    key = NATIVE_LIST.get(turn.dialect)
    try:
        body = json.loads(_decoded(turn))
    except (ValueError, UnicodeDecodeError, HarnessRLError):
        return None, None
    if not isinstance(body, dict) or key not in body:
        return None, None
    return key, body[key]


def _new_items(items: Any, before: Any) -> tuple[str, int, Any]:
    """What `items` adds to `before`: ("extends", n, the tail) when it starts with all n
    of `before`'s items; ("diverges", k, items from k on) when only k items are shared;
    ("first", 0, everything) when there is nothing before."""
    if before is None or not isinstance(items, list) or not isinstance(before, list):
        return "first", 0, items
    shared = 0
    for mine, theirs in zip(items, before, strict=False):
        if mine != theirs:
            break
        shared += 1
    how = "extends" if shared == len(before) else "diverges"
    return how, shared, items[shared:]


def _messages(turn: Turn) -> tuple[Message, ...] | None:
    return turn.request.messages if turn.request is not None else None


def _canonical_new(turn: Turn, prev: Turn | None) -> tuple[str, int, list[Any]]:
    mine = _messages(turn)
    if mine is None:
        return "absent", 0, []
    before = _messages(prev) if prev is not None else None
    how, shared, new = _new_items(list(mine), None if before is None else list(before))
    if how == "extends":  # the previous reply, echoed back, is shown as that turn's reply
        while new and new[0].role == "assistant":
            new, shared = new[1:], shared + 1
    return how, shared, [msgspec.to_builtins(m) for m in new]


def summary(turn: Turn, prev: Turn | None) -> dict[str, Any]:
    """One turn for the conversation view; `prev` is the turn before it (or None)."""
    how, shared, messages = _canonical_new(turn, prev)
    key, items = _native(turn)
    _, prev_items = _native(prev) if prev is not None else (None, None)
    native_how, native_shared, native_new = _new_items(items, prev_items)
    c = turn.completion
    tokens = c.tokens if c is not None else None
    return clip({
        "index": turn.index, "dialect": turn.dialect, "status": turn.status,
        "error": turn.error, "flags": list(turn.flags), "model": turn.model,
        "engine": turn.engine, "weight_version": turn.weight_version,
        "timings": msgspec.to_builtins(turn.timings), "reply_id": turn.reply_id,
        "content_encoding": turn.content_encoding, "retry_count": turn.retry_count,
        "retry_of": turn.retry_of, "history": how, "shown_from": shared, "messages": messages,
        "tools": [t.name for t in turn.request.tools] if turn.request else [],
        "completion": None if c is None else {
            "parts": msgspec.to_builtins(c.parts), "finish_reason": c.finish_reason,
            "usage": msgspec.to_builtins(c.usage)},
        "prompt_tokens": _count(tokens.prompt_ids if tokens else None),
        "completion_tokens": _count(tokens.completion_ids if tokens else None),
        "native": {"key": key, "history": native_how if key else "absent",
                   "shown_from": native_shared, "items": native_new if key else []},
    })


def _count(ids: Sequence[int] | None) -> int | None:
    return None if ids is None else len(ids)


def summaries(turns: Sequence[Turn], before: Turn | None) -> list[dict[str, Any]]:
    """Consecutive turns; `before` is the turn preceding the first (None at the start)."""
    out = []
    for turn in turns:
        out.append(summary(turn, before))
        before = turn
    return out


def _decoded(turn: Turn) -> bytes:
    """The request body as the proxy parsed it: its content coding undone."""
    return codings.undo(turn.raw_request, turn.content_encoding, DECODED_LIMIT)


def _raw_request(turn: Turn) -> dict[str, Any]:
    """The raw request as text: decoded when it came coded (`coding` says how, `bytes`
    counts the bytes received), or why it does not decode."""
    if not turn.content_encoding:
        return _raw_text(turn.raw_request)
    try:
        shown = _raw_text(_decoded(turn))
    except HarnessRLError as err:
        shown = {"kind": "text", "text": f"not decoded: {err.message}", "clipped": False}
    return {**shown, "bytes": len(turn.raw_request), "coding": turn.content_encoding}


def _raw_text(raw: bytes) -> dict[str, Any]:
    """A raw body as text: JSON pretty-printed, anything else (SSE) as sent."""
    text = raw[:RAW_LIMIT].decode("utf-8", errors="replace")
    try:
        text = json.dumps(json.loads(raw), indent=2, ensure_ascii=False)[:RAW_LIMIT]
        kind = "json"
    except ValueError:
        kind = "sse" if text.startswith(("event:", "data:")) else "text"
    return {"kind": kind, "bytes": len(raw), "text": text,
            "clipped": len(raw) > RAW_LIMIT}


def detail(turn: Turn) -> dict[str, Any]:
    """Everything recorded about one turn, raw bodies included."""
    return {
        "index": turn.index, "dialect": turn.dialect, "status": turn.status,
        "error": turn.error, "flags": list(turn.flags),
        "raw_request": _raw_request(turn),
        "raw_response": _raw_text(turn.raw_response),
        "request": clip(msgspec.to_builtins(turn.request)),
        "completion": clip(_without_tokens(turn)),
        "requested_sampling": msgspec.to_builtins(turn.requested_sampling),
        "used_sampling": msgspec.to_builtins(turn.used_sampling),
        "timings": msgspec.to_builtins(turn.timings), "model": turn.model,
        "engine": turn.engine, "weight_version": turn.weight_version,
        "reply_id": turn.reply_id, "content_encoding": turn.content_encoding,
        "retry_count": turn.retry_count, "retry_of": turn.retry_of,
    }


def _without_tokens(turn: Turn) -> dict[str, Any] | None:
    if turn.completion is None:
        return None
    completion = msgspec.to_builtins(turn.completion)
    del completion["tokens"]  # the tokens page shows them, decoded and coloured
    return completion
