"""The durable trace store: one SQLite file (WAL) per run directory.

`TraceReader` reads a run and starts no thread: the viewer, exports, reports and the
runner's reads use it. `TraceStore` is the writer (a reader too: the proxy reads what it
wrote), a context manager: writes go through one writer thread that commits whatever is
queued as one transaction (group commit), so many concurrent turns cost one fsync between
them, and `add_turn` returns only once its turn is committed. Token ids and logprobs are
stored as packed little-endian arrays (int32, float64), not JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import sys
import threading
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

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

DB_NAME = "trace.db"
SCHEMA_VERSION = 3
_TABLES = (
    """CREATE TABLE IF NOT EXISTS rollouts (
    key TEXT PRIMARY KEY,
    created REAL NOT NULL,
    closed REAL,
    sampling BLOB,
    unset_sampling TEXT NOT NULL DEFAULT '[]',
    metadata BLOB NOT NULL DEFAULT '{}',
    harness,
    task
)""",
    """CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY,
    rollout TEXT NOT NULL REFERENCES rollouts(key),
    idx INTEGER NOT NULL,
    dialect TEXT NOT NULL,
    status TEXT NOT NULL,
    received REAL NOT NULL,
    first_token REAL,
    done REAL,
    engine TEXT,
    model TEXT,
    weight_version TEXT,
    error TEXT,
    flags TEXT NOT NULL DEFAULT '[]',
    requested_sampling BLOB,
    used_sampling BLOB,
    request BLOB,
    completion BLOB,
    prompt_ids BLOB,
    completion_ids BLOB,
    logprobs BLOB,
    raw_request BLOB NOT NULL,
    raw_response BLOB NOT NULL,
    reply_id TEXT,
    error_kind TEXT,
    UNIQUE (rollout, idx)
)""",
    """CREATE TABLE IF NOT EXISTS outcomes (
    harness TEXT NOT NULL,
    task TEXT NOT NULL,
    sample INTEGER NOT NULL,
    rollout TEXT NOT NULL,
    status TEXT NOT NULL,
    reward REAL,
    outcome BLOB NOT NULL,
    harness_version TEXT,
    verifier_reward REAL,
    tool_calls INTEGER,
    completion_tokens INTEGER,
    PRIMARY KEY (harness, task, sample)
)""",
)
# The rollouts' `harness` and `task` are copied from their metadata (what the runner puts
# there), declared without a type so that they hold the value as given, as json_extract
# would return it; the outcomes' columns are the fields of the outcome the viewer filters,
# sorts and averages on. Both are written with the row, so no page parses JSON to filter.
_INDEXES = {
    "turns_by_reply": "CREATE INDEX IF NOT EXISTS turns_by_reply ON turns (rollout, reply_id)",
    # What the trace viewer's pages look up (harnessrl.ui.queries): models of a run without
    # a scan of the turns, outcomes by rollout, rollouts by age. Small, cheap on insert.
    "turns_by_model": "CREATE INDEX IF NOT EXISTS turns_by_model ON turns (model)",
    "outcomes_by_rollout": "CREATE INDEX IF NOT EXISTS outcomes_by_rollout ON outcomes (rollout)",
    "rollouts_by_created": "CREATE INDEX IF NOT EXISTS rollouts_by_created ON rollouts (created)",
}
_OUTCOME_JSON = "CAST(outcome AS TEXT)"
_METADATA_JSON = "CAST(metadata AS TEXT)"


@dataclass(frozen=True, slots=True)
class _Step:
    """Brings a file from one schema version to the next: columns to add (when missing: a
    table created by this version's `_TABLES` has them already), then statements that fill
    them for the rows already there."""

    columns: tuple[tuple[str, str, str], ...]  # (table, column, declaration)
    fill: tuple[str, ...] = ()


# Steps that bring an older file up to SCHEMA_VERSION, by the version they start from.
_MIGRATIONS = {
    1: _Step((("turns", "reply_id", "TEXT"),)),
    2: _Step(
        (("turns", "error_kind", "TEXT"), ("rollouts", "harness", ""), ("rollouts", "task", ""),
         ("outcomes", "harness_version", "TEXT"), ("outcomes", "verifier_reward", "REAL"),
         ("outcomes", "tool_calls", "INTEGER"), ("outcomes", "completion_tokens", "INTEGER")),
        (  # errors were recorded as "kind: message"
            "UPDATE turns SET error_kind = CASE WHEN instr(error, ':') > 0"
            " THEN substr(error, 1, instr(error, ':') - 1) ELSE error END"
            " WHERE error IS NOT NULL AND error_kind IS NULL",
            f"UPDATE rollouts SET harness = json_extract({_METADATA_JSON}, '$.harness'),"
            f" task = json_extract({_METADATA_JSON}, '$.task')",
            # An outcome's JSON omits its defaults: no tool calls or tokens is 0.
            f"UPDATE outcomes SET harness_version = json_extract({_OUTCOME_JSON},"
            f" '$.harness_version'), verifier_reward = json_extract({_OUTCOME_JSON},"
            f" '$.verifier_reward'), tool_calls = COALESCE(json_extract({_OUTCOME_JSON},"
            f" '$.tool_calls'), 0), completion_tokens = COALESCE(json_extract({_OUTCOME_JSON},"
            " '$.completion_tokens'), 0)",
        )),
}
_TURN_COLUMNS = (
    "rollout, idx, dialect, status, received, first_token, done, engine, model, weight_version,"
    " error, flags, requested_sampling, used_sampling, request, completion, prompt_ids,"
    " completion_ids, logprobs, raw_request, raw_response, reply_id, error_kind"
)
TURN_COLUMNS = _TURN_COLUMNS  # for readers outside this module (the viewer)
_INSERT_TURN = f"INSERT INTO turns ({_TURN_COLUMNS}) VALUES ({', '.join('?' * 23)})"
_ROLLOUT_COLUMNS = "key, created, closed, sampling, unset_sampling, metadata"
_INSERT_ROLLOUT = (f"INSERT OR REPLACE INTO rollouts ({_ROLLOUT_COLUMNS}, harness, task)"
                   f" VALUES ({', '.join('?' * 8)})")
_INSERT_OUTCOME = (
    "INSERT OR REPLACE INTO outcomes (harness, task, sample, rollout, status, reward, outcome,"
    f" harness_version, verifier_reward, tool_calls, completion_tokens)"
    f" VALUES ({', '.join('?' * 11)})")
# Fold the WAL back into the database after about this much has been written to it.
CHECKPOINT_BYTES = 8 * 1024 * 1024
_NO_TOKENS = Tokens(None, None, None)
_encode = msgspec.json.Encoder().encode
_LITTLE = sys.byteorder == "little"


def pack(values: tuple[int, ...] | tuple[float, ...] | None, code: str) -> bytes | None:
    if values is None:
        return None
    packed = array(code, values)
    if not _LITTLE:
        packed.byteswap()
    return packed.tobytes()


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


def _turn_row(turn: Turn) -> tuple[Any, ...]:
    completion = turn.completion
    tokens = completion.tokens if completion is not None else _NO_TOKENS
    if completion is not None:  # tokens live in their own packed columns
        completion = msgspec.structs.replace(completion, tokens=_NO_TOKENS)
    t = turn.timings
    return (
        turn.rollout, turn.index, turn.dialect, turn.status, t.received, t.first_token, t.done,
        turn.engine, turn.model, turn.weight_version, turn.error, _text(list(turn.flags)),
        _json(turn.requested_sampling), _json(turn.used_sampling), _json(turn.request),
        _json(completion), pack(tokens.prompt_ids, "i"), pack(tokens.completion_ids, "i"),
        pack(tokens.logprobs, "d"), turn.raw_request, turn.raw_response, turn.reply_id,
        turn.error_kind,
    )


def _load(blob: bytes | None, kind: type) -> Any:
    return None if blob is None else msgspec.json.decode(blob, type=kind)


def _row_turn(row: tuple[Any, ...]) -> Turn:
    (rollout, idx, dialect, status, received, first_token, done, engine, model, weight_version,
     error, flags, requested, used, request, completion, prompt_ids, completion_ids, logprobs,
     raw_request, raw_response, reply_id, error_kind) = row
    loaded = _load(completion, Completion)
    if loaded is not None:
        loaded = msgspec.structs.replace(loaded, tokens=Tokens(
            unpack(prompt_ids, "i"), unpack(completion_ids, "i"), unpack(logprobs, "d")))
    return Turn(
        rollout=rollout, index=idx, dialect=dialect, status=status,
        timings=Timings(received, first_token, done), raw_request=raw_request,
        raw_response=raw_response, request=_load(request, ChatRequest), completion=loaded,
        requested_sampling=_load(requested, Sampling), used_sampling=_load(used, Sampling),
        engine=engine, model=model, weight_version=weight_version, error=error,
        error_kind=error_kind, flags=tuple(msgspec.json.decode(flags)), reply_id=reply_id,
    )


def row_turn(row: tuple[Any, ...]) -> Turn:
    """A `Turn` from a row of `SELECT {TURN_COLUMNS} FROM turns`."""
    return _row_turn(row)


def _row_rollout(row: tuple[Any, ...]) -> Rollout:
    key, created, closed, sampling, unset, metadata = row
    return Rollout(key=key, created=created, closed=closed, sampling=_load(sampling, Sampling),
                   unset_sampling=tuple(msgspec.json.decode(unset)),
                   metadata=msgspec.json.decode(metadata))


def _rollout_params(rollout: Rollout) -> tuple[Any, ...]:
    meta = rollout.metadata
    return (rollout.key, rollout.created, rollout.closed, _json(rollout.sampling),
            _text(list(rollout.unset_sampling)), _encode(meta),
            _sql_value(meta.get("harness")), _sql_value(meta.get("task")))


def _sql_value(value: Any) -> Any:
    """A metadata value as SQLite's json_extract gives it: scalars as they are (booleans
    as 0 or 1), arrays and objects as JSON text."""
    if value is None or isinstance(value, str | int | float):
        return value
    return _text(value)


def _outcome_params(outcome: Outcome) -> tuple[Any, ...]:
    return (outcome.harness, outcome.task, outcome.sample, outcome.rollout, outcome.status,
            outcome.reward, _encode(outcome), outcome.harness_version,
            outcome.verifier_reward, outcome.tool_calls, outcome.completion_tokens)


def connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL mode: a committed transaction survives a crash of the process (the
    # case we must cover); only a power loss can drop the last commits.
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA busy_timeout=10000")
    return db


def migrate(path: Path) -> None:
    """Bring the store at `path` up to SCHEMA_VERSION (creating it if missing), in one
    transaction; a file that is up to date and has every index is only read."""
    db = connect(path)
    try:
        if not _outdated(db):
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]  # another may have won
            for table in _TABLES:
                db.execute(table)
            # A file from before versioning (0) gets every step: each adds only what lacks.
            for step in range(max(version, 1), SCHEMA_VERSION):
                _apply(db, _MIGRATIONS[step])
            for index in _INDEXES.values():
                db.execute(index)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    finally:
        db.close()


def _outdated(db: sqlite3.Connection) -> bool:
    if db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
        return True
    indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    return not indexes.issuperset(_INDEXES)


def _apply(db: sqlite3.Connection, step: _Step) -> None:
    for table, column, declaration in step.columns:
        if column not in {r[1] for r in db.execute(f"PRAGMA table_info({table})")}:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}".rstrip())
    for statement in step.fill:
        db.execute(statement)


class TraceReader:
    """Reads of one run's store; starts no thread. Call them from a thread in async code:
    each thread that reads gets its own connection, closed by `close` (or the `with`)."""

    def __init__(self, run_dir: Path, *, up_to_date: bool = False) -> None:
        """Opening brings the store up to date (`migrate`) unless the caller already has
        (`up_to_date`)."""
        self.path = run_dir / DB_NAME
        if not up_to_date:
            migrate(self.path)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes every thread's connection; a read after this opens a new one."""
        with self._lock:
            connections, self._connections = self._connections, []
            self._local = threading.local()
        for db in connections:
            db.close()

    @property
    def db(self) -> sqlite3.Connection:
        """This thread's connection."""
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = connect(self.path)
            with self._lock:
                self._connections.append(db)
        return db

    def rollout(self, key: str) -> Rollout | None:
        row = self.db.execute(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE key = ?",
                              (key,)).fetchone()
        return None if row is None else _row_rollout(row)

    def next_index(self, key: str) -> int:
        row = self.db.execute("SELECT MAX(idx) FROM turns WHERE rollout = ?", (key,)).fetchone()
        return 0 if row[0] is None else row[0] + 1

    def turns(self, key: str, offset: int = 0, limit: int = -1) -> list[Turn]:
        rows = self.db.execute(
            f"SELECT {_TURN_COLUMNS} FROM turns WHERE rollout = ? ORDER BY idx LIMIT ? OFFSET ?",
            (key, limit, offset)).fetchall()
        return [_row_turn(r) for r in rows]

    def turn_by_reply(self, key: str, reply_id: str) -> Turn | None:
        row = self.db.execute(
            f"SELECT {_TURN_COLUMNS} FROM turns WHERE rollout = ? AND reply_id = ?",
            (key, reply_id)).fetchone()
        return None if row is None else _row_turn(row)

    def iter_turns(self, batch: int = 256) -> Iterator[Turn]:
        cursor = self.db.execute(f"SELECT {_TURN_COLUMNS} FROM turns ORDER BY rollout, idx")
        while rows := cursor.fetchmany(batch):
            yield from (_row_turn(r) for r in rows)

    def iter_rollouts(self) -> Iterator[Rollout]:
        for row in self.db.execute(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts ORDER BY created"):
            yield _row_rollout(row)

    def outcomes(self) -> list[Outcome]:
        rows = self.db.execute("SELECT outcome FROM outcomes ORDER BY harness, task, sample")
        return [msgspec.json.decode(row[0], type=Outcome) for row in rows]

    def turn_counts(self) -> dict[str, int]:
        return dict(self.db.execute("SELECT rollout, COUNT(*) FROM turns GROUP BY rollout"))

    def count_turns(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM turns").fetchone()[0]

    def integrity_check(self) -> str:
        return self.db.execute("PRAGMA integrity_check").fetchone()[0]


class TraceStore(TraceReader):
    """The writer of one run's store, and a reader of it: `with TraceStore(run_dir) as
    store:`. Writes go through `add_turn` / `put_rollout` / `put_outcome`, awaited until
    committed; leaving the block (or `close`) drains the queue and stops the threads."""

    def __init__(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(run_dir)
        self._queue: queue.SimpleQueue[_Write | None] = queue.SimpleQueue()
        self._wal_bytes = 0
        self._checkpoint_due = threading.Event()
        self._stop = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="trace-writer",
                                        daemon=True)
        self._checkpointer = threading.Thread(target=self._checkpoint_loop,
                                              name="trace-checkpoint", daemon=True)
        self._writer.start()
        self._checkpointer.start()

    # ---------------------------------------------------------------- writes
    async def add_turn(self, turn: Turn) -> None:
        # The row is packed on the writer thread, off the event loop.
        await self._submit(_INSERT_TURN, lambda: _turn_row(turn))

    async def put_rollout(self, rollout: Rollout) -> None:
        await self._submit(_INSERT_ROLLOUT, lambda: _rollout_params(rollout))

    async def put_outcome(self, outcome: Outcome) -> None:
        """The rollout's final result; a retried rollout replaces its earlier attempt."""
        await self._submit(_INSERT_OUTCOME, lambda: _outcome_params(outcome))

    async def _submit(self, sql: str, params: Callable[[], tuple[Any, ...]]) -> None:
        if self._stop.is_set():  # no writer is left to commit it: fail, never wait
            raise sqlite3.ProgrammingError("the trace store is closed")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put(_Write(sql, params, loop, future))
        await future

    def _write_loop(self) -> None:
        db = connect(self.path)
        # The WAL is folded back by `_checkpoint_loop`, off the commit path: an automatic
        # checkpoint inside a commit stalls every turn waiting on it for milliseconds.
        db.execute("PRAGMA wal_autocheckpoint=0")
        while (item := self._queue.get()) is not None:
            batch = [item]
            while len(batch) < 512:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.append(nxt)
            self._commit(db, batch)
        db.close()

    def _commit(self, db: sqlite3.Connection, batch: list[_Write]) -> None:
        packed = [_pack(w) for w in batch]
        rows = [p for p in packed if not isinstance(p, Exception)]
        try:
            db.execute("BEGIN IMMEDIATE")
            for sql, params in rows:
                db.execute(sql, params)
            db.execute("COMMIT")
            done: list[Exception | None] = [None] * len(rows)
        except sqlite3.Error:
            if db.in_transaction:
                db.execute("ROLLBACK")
            done = [self._commit_one(db, sql, params) for sql, params in rows]
        committed = iter(done)
        results = [p if isinstance(p, Exception) else next(committed) for p in packed]
        self._note_written(rows)
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Any, Exception | None]]] = {}
        for write, error in zip(batch, results, strict=True):
            by_loop.setdefault(write.loop, []).append((write.future, error))
        for loop, settled in by_loop.items():  # one wake-up per loop, not one per turn
            loop.call_soon_threadsafe(_settle_all, settled)

    @staticmethod
    def _commit_one(db: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> Exception | None:
        """After a failed group, each write alone: one bad row must not sink the others."""
        try:
            db.execute(sql, params)
            return None
        except sqlite3.Error as exc:
            return exc

    def _note_written(self, rows: list[tuple[str, tuple[Any, ...]]]) -> None:
        self._wal_bytes += sum(len(v) for _, params in rows for v in params
                               if isinstance(v, bytes | str))
        if self._wal_bytes >= CHECKPOINT_BYTES:
            self._wal_bytes = 0
            self._checkpoint_due.set()

    def _checkpoint_loop(self) -> None:
        db = connect(self.path)
        while not self._stop.is_set():
            self._checkpoint_due.wait()
            self._checkpoint_due.clear()
            with contextlib.suppress(sqlite3.Error):
                db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        db.close()

    def close(self) -> None:
        """Commits what is queued, stops the writer threads and closes the connections;
        a second call does nothing more."""
        if not self._stop.is_set():
            self._queue.put(None)
            self._writer.join(timeout=30)
            self._stop.set()
            self._checkpoint_due.set()
            self._checkpointer.join(timeout=30)
        super().close()


@dataclass(frozen=True, slots=True)
class _Write:
    sql: str
    params: Callable[[], tuple[Any, ...]]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


def _pack(write: _Write) -> tuple[str, tuple[Any, ...]] | Exception:
    """The row to write, or why it cannot be: a row that fails to pack fails alone, as a
    store error its caller reports, and the writer thread goes on."""
    try:
        return write.sql, write.params()
    except Exception as exc:
        error = sqlite3.DataError(f"cannot pack the row: {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        return error


def _settle_all(settled: list[tuple[asyncio.Future[None], Exception | None]]) -> None:
    for future, error in settled:
        if future.done():  # its caller was cancelled; the row is committed anyway
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

