"""Write a run's turns or rollouts as JSONL or Parquet, streaming from the store."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import msgspec

from harnessrl.errors import HarnessRLError
from harnessrl.proxy.wire import codings
from harnessrl.store.reader import TraceReader
from harnessrl.types import Rollout, Turn

_encode = msgspec.json.Encoder().encode
# The most a coded request body is decoded to for its text column.
DECODED_LIMIT = 256 * 1024 * 1024


def turn_row(turn: Turn) -> dict[str, Any]:
    """A flat row: ids and logprobs as lists, canonical views as JSON text, raw payloads as
    text (they are UTF-8 JSON or SSE; a request received in a content coding decoded, the
    coding in `content_encoding`). Missing tokens stay null."""
    tokens = turn.completion.tokens if turn.completion is not None else None
    return {
        "rollout": turn.rollout, "index": turn.index, "dialect": turn.dialect,
        "status": turn.status, "engine": turn.engine, "model": turn.model,
        "weight_version": turn.weight_version, "received": turn.timings.received,
        "first_token": turn.timings.first_token, "done": turn.timings.done,
        "error": turn.error, "error_kind": turn.error_kind, "flags": list(turn.flags),
        "prompt_ids": None if tokens is None or tokens.prompt_ids is None
        else list(tokens.prompt_ids),
        "completion_ids": None if tokens is None or tokens.completion_ids is None
        else list(tokens.completion_ids),
        "logprobs": None if tokens is None or tokens.logprobs is None else list(tokens.logprobs),
        "request": _json_text(turn.request),
        "completion": None if turn.completion is None else _json_text(
            {k: v for k, v in msgspec.to_builtins(turn.completion).items() if k != "tokens"}),
        "requested_sampling": _json_text(turn.requested_sampling),
        "used_sampling": _json_text(turn.used_sampling),
        "raw_request": _request_text(turn),
        "raw_response": turn.raw_response.decode("utf-8", "replace"),
        "content_encoding": turn.content_encoding, "retry_count": turn.retry_count,
        "retry_of": turn.retry_of,
    }


def _request_text(turn: Turn) -> str:
    raw = turn.raw_request
    # one the proxy refused when it came (a bomb, say) stays as it came
    with contextlib.suppress(HarnessRLError):
        raw = codings.undo(raw, turn.content_encoding, DECODED_LIMIT)
    return raw.decode("utf-8", "replace")


def rollout_row(rollout: Rollout, turns: int) -> dict[str, Any]:
    return {"key": rollout.key, "created": rollout.created, "closed": rollout.closed,
            "sampling": _json_text(rollout.sampling),
            "unset_sampling": list(rollout.unset_sampling),
            "metadata": _json_text(rollout.metadata), "turns": turns}


def _json_text(value: Any) -> str | None:
    return None if value is None else _encode(value).decode()


def _rows(store: TraceReader, what: str) -> Iterator[dict[str, Any]]:
    if what == "turns":
        yield from (turn_row(t) for t in store.iter_turns())
    else:
        counts = store.turn_counts()
        yield from (rollout_row(r, counts.get(r.key, 0)) for r in store.iter_rollouts())


def export(run_dir: Path, out: Path, *, what: Literal["turns", "rollouts"] = "turns",
           fmt: Literal["jsonl", "parquet"] = "jsonl", batch: int = 1024) -> int:
    if not (run_dir / "trace.db").is_file():
        raise FileNotFoundError(f"no trace store in {run_dir}")
    with TraceReader(run_dir) as store:
        rows = _rows(store, what)
        if fmt == "jsonl":
            return _write_jsonl(rows, out)
        return _write_parquet(rows, out, _schema(what), batch)


def _write_jsonl(rows: Iterator[dict[str, Any]], out: Path) -> int:
    count = 0
    with out.open("wb") as f:
        for row in rows:
            f.write(_encode(row) + b"\n")
            count += 1
    return count


def _schema(what: str) -> Any:
    import pyarrow as pa

    text, real, ids = pa.string(), pa.float64(), pa.list_(pa.int32())
    if what == "rollouts":
        return pa.schema([("key", text), ("created", real), ("closed", real),
                          ("sampling", text), ("unset_sampling", pa.list_(text)),
                          ("metadata", text), ("turns", pa.int64())])
    return pa.schema([
        ("rollout", text), ("index", pa.int32()), ("dialect", text), ("status", text),
        ("engine", text), ("model", text), ("weight_version", text), ("received", real),
        ("first_token", real), ("done", real), ("error", text), ("error_kind", text),
        ("flags", pa.list_(text)),
        ("prompt_ids", ids), ("completion_ids", ids), ("logprobs", pa.list_(real)),
        ("request", text), ("completion", text), ("requested_sampling", text),
        ("used_sampling", text), ("raw_request", text), ("raw_response", text),
        ("content_encoding", text), ("retry_count", pa.int64()), ("retry_of", pa.int32()),
    ])


def _write_parquet(rows: Iterator[dict[str, Any]], out: Path, schema: Any, batch: int) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    count = 0
    with pq.ParquetWriter(out, schema) as writer:
        chunk: list[dict[str, Any]] = []
        for row in rows:
            chunk.append(row)
            if len(chunk) == batch:
                writer.write_table(pa.Table.from_pylist(chunk, schema=schema))
                count, chunk = count + len(chunk), []
        if chunk:
            writer.write_table(pa.Table.from_pylist(chunk, schema=schema))
            count += len(chunk)
    return count
