"""Rows of the trace store: the columns each table is written with, and the conversions
between `Turn` / `Rollout` / `Outcome` and those rows. Token ids and logprobs are packed
little-endian arrays (int32, float64), not JSON. A turn's row as schema v4 wrote it (all
whole) is `turn_row`/`row_turn`; what v5 stores instead is `store.layout`'s."""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from typing import Any

import msgspec

from harnessrl.types import (
    ChatRequest,
    Completion,
    Outcome,
    Rollout,
    Sampling,
    Timings,
    Tokens,
    Turn,
)

TURN_COLUMNS = (
    "rollout, idx, dialect, status, received, first_token, done, engine, model, weight_version,"
    " error, flags, requested_sampling, used_sampling, request, completion, prompt_ids,"
    " completion_ids, logprobs, raw_request, raw_response, reply_id, error_kind,"
    " content_encoding, retry_count, retry_of"
)
# Schema v6's columns, NULL when read from an older file that could not be brought up to
# date (read-only).
V6_COLUMNS = ("content_encoding", "retry_count", "retry_of")
# Schema v5's layout of a row (`store.layout`); NULL in a row written by schema v4.
LAYOUT_COLUMNS = "layout, prompt_parent, prompt_keep, prompt_len, body_base"
READ_COLUMNS = f"{TURN_COLUMNS}, {LAYOUT_COLUMNS}"
INSERT_TURN = (f"INSERT INTO turns ({READ_COLUMNS})"
               f" VALUES ({', '.join('?' * len(READ_COLUMNS.split(',')))})")
ROLLOUT_COLUMNS = "key, created, closed, sampling, unset_sampling, metadata, max_model_calls"
INSERT_ROLLOUT = (f"INSERT OR REPLACE INTO rollouts ({ROLLOUT_COLUMNS}, harness, task)"
                   f" VALUES ({', '.join('?' * 9)})")
INSERT_OUTCOME = (
    "INSERT OR REPLACE INTO outcomes (harness, task, sample, rollout, status, reward, outcome,"
    f" harness_version, verifier_reward, tool_calls, completion_tokens)"
    f" VALUES ({', '.join('?' * 11)})")
# Fold the WAL back into the database after about this much has been written to it.
_NO_TOKENS = Tokens(None, None, None)
_encode = msgspec.json.Encoder().encode
_LITTLE = sys.byteorder == "little"


def pack(values: tuple[int, ...] | tuple[float, ...] | None, code: str) -> bytes | None:
    """Little-endian int32 ("i") or float64 ("d") values. `struct` rather than `array`:
    a 4,000-id prompt packs in under half the time (about 20 µs against 51 here).
    A value out of range raises (struct.error), as it must: never stored wrapped."""
    if values is None:
        return None
    return struct.pack(f"<{len(values)}{code}", *values)


def unpack(blob: bytes | None, code: str) -> tuple[Any, ...] | None:
    if blob is None:
        return None
    values = array(code)
    values.frombytes(blob)
    if not _LITTLE:
        values.byteswap()
    return tuple(values)


def _json(value: Any) -> bytes | None:
    return None if value is None else _encode(value)


def _text(value: Any) -> str:
    return _encode(value).decode()


def turn_row(turn: Turn, *, whole: bool = True) -> tuple[Any, ...]:
    """The v4 columns of `turn`. Not `whole`: the request, prompt ids and raw bodies are
    left None for the caller (`store.layout`) to fill with what is new."""
    completion = turn.completion
    tokens = completion.tokens if completion is not None else _NO_TOKENS
    if completion is not None:  # tokens live in their own packed columns
        completion = msgspec.structs.replace(completion, tokens=_NO_TOKENS)
    t = turn.timings
    return (
        turn.rollout, turn.index, turn.dialect, turn.status, t.received, t.first_token, t.done,
        turn.engine, turn.model, turn.weight_version, turn.error, _text(list(turn.flags)),
        _json(turn.requested_sampling), _json(turn.used_sampling),
        _json(turn.request) if whole else None, _json(completion),
        pack(tokens.prompt_ids, "i") if whole else None, pack(tokens.completion_ids, "i"),
        pack(tokens.logprobs, "d"), turn.raw_request if whole else None,
        turn.raw_response if whole else None, turn.reply_id, turn.error_kind,
        turn.content_encoding, turn.retry_count, turn.retry_of,
    )


def _load(blob: bytes | None, kind: type) -> Any:
    return None if blob is None else msgspec.json.decode(blob, type=kind)


def row_turn(row: Sequence[Any], *, request_decoded: bool = False) -> Turn:
    """A `Turn` from the v4 columns of a row (`SELECT {TURN_COLUMNS} FROM turns`);
    `request_decoded`: its request is a `ChatRequest` already, not JSON."""
    (rollout, idx, dialect, status, received, first_token, done, engine, model, weight_version,
     error, flags, requested, used, request, completion, prompt_ids, completion_ids, logprobs,
     raw_request, raw_response, reply_id, error_kind, content_encoding, retry_count,
     retry_of) = row
    loaded = _load(completion, Completion)
    if loaded is not None:
        loaded = msgspec.structs.replace(loaded, tokens=Tokens(
            unpack(prompt_ids, "i"), unpack(completion_ids, "i"), unpack(logprobs, "d")))
    return Turn(
        rollout=rollout, index=idx, dialect=dialect, status=status,
        timings=Timings(received, first_token, done), raw_request=raw_request,
        raw_response=raw_response, completion=loaded,
        request=request if request_decoded else _load(request, ChatRequest),
        requested_sampling=_load(requested, Sampling), used_sampling=_load(used, Sampling),
        engine=engine, model=model, weight_version=weight_version, error=error,
        error_kind=error_kind, flags=tuple(msgspec.json.decode(flags)), reply_id=reply_id,
        content_encoding=content_encoding, retry_count=retry_count, retry_of=retry_of,
    )


def row_rollout(row: tuple[Any, ...]) -> Rollout:
    key, created, closed, sampling, unset, metadata, max_model_calls = row
    return Rollout(key=key, created=created, closed=closed, sampling=_load(sampling, Sampling),
                   unset_sampling=tuple(msgspec.json.decode(unset)),
                   metadata=msgspec.json.decode(metadata), max_model_calls=max_model_calls)


def rollout_params(rollout: Rollout) -> tuple[Any, ...]:
    meta = rollout.metadata
    return (rollout.key, rollout.created, rollout.closed, _json(rollout.sampling),
            _text(list(rollout.unset_sampling)), _encode(meta), rollout.max_model_calls,
            _sql_value(meta.get("harness")), _sql_value(meta.get("task")))


def _sql_value(value: Any) -> Any:
    """A metadata value as SQLite's json_extract gives it: scalars as they are (booleans
    as 0 or 1), arrays and objects as JSON text."""
    if value is None or isinstance(value, str | int | float):
        return value
    return _text(value)


def outcome_params(outcome: Outcome) -> tuple[Any, ...]:
    return (outcome.harness, outcome.task, outcome.sample, outcome.rollout, outcome.status,
            outcome.reward, _encode(outcome), outcome.harness_version,
            outcome.verifier_reward, outcome.tool_calls, outcome.completion_tokens)

