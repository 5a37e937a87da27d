"""The durable trace store: one SQLite file (WAL) per run directory.

`TraceReader` reads a run and starts no thread: the viewer, exports, reports and the
runner's reads use it. `TraceStore` is the writer (a reader too: the proxy reads what it
wrote), a context manager: writes go through one writer thread that commits whatever is
queued as one transaction (group commit), so many concurrent turns cost one fsync between
them, and `add_turn` returns only once its turn is committed. The one call in flight
(`add_turn(alone=True)`) commits its turn itself when that writer is idle: the hand-off
to the thread and back costs as much as the commit. Writers in several processes
(`serve --workers N`) take turns on a lock file beside the store (`WriterLock`) rather than
on SQLite's busy handler, which sleeps 1, 2, 5, 10 ms... between tries: under load that
sleeping left cores idle and held every turn's last byte. Token ids and logprobs are
stored as packed little-endian arrays (int32, float64), not JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import msgspec

from harnessrl.proxy.rows import (
    INSERT_OUTCOME,
    INSERT_ROLLOUT,
    INSERT_TURN,
    ROLLOUT_COLUMNS,
    TURN_COLUMNS,
    outcome_params,
    rollout_params,
    row_rollout,
    row_turn,
    turn_row,
)
from harnessrl.proxy.schema import DB_NAME, connect, migrate
from harnessrl.types import Outcome, Rollout, Turn

# Fold the WAL back into the database after about this much has been written to it.
CHECKPOINT_BYTES = 8 * 1024 * 1024


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
        row = self.db.execute(f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE key = ?",
                              (key,)).fetchone()
        return None if row is None else row_rollout(row)

    def next_index(self, key: str) -> int:
        row = self.db.execute("SELECT MAX(idx) FROM turns WHERE rollout = ?", (key,)).fetchone()
        return 0 if row[0] is None else row[0] + 1

    def model_calls(self, key: str) -> int:
        """The rollout's model calls that count against its `max_model_calls`: every
        recorded call but those refused for being over the cap."""
        return self.db.execute(
            "SELECT COUNT(*) FROM turns WHERE rollout = ? AND error_kind IS NOT 'step_cap'",
            (key,)).fetchone()[0]

    def turns(self, key: str, offset: int = 0, limit: int = -1) -> list[Turn]:
        rows = self.db.execute(
            f"SELECT {TURN_COLUMNS} FROM turns WHERE rollout = ? ORDER BY idx LIMIT ? OFFSET ?",
            (key, limit, offset)).fetchall()
        return [row_turn(r) for r in rows]

    def turn_by_reply(self, key: str, reply_id: str) -> Turn | None:
        row = self.db.execute(
            f"SELECT {TURN_COLUMNS} FROM turns WHERE rollout = ? AND reply_id = ?",
            (key, reply_id)).fetchone()
        return None if row is None else row_turn(row)

    def iter_turns(self, batch: int = 256) -> Iterator[Turn]:
        cursor = self.db.execute(f"SELECT {TURN_COLUMNS} FROM turns ORDER BY rollout, idx")
        while rows := cursor.fetchmany(batch):
            yield from (row_turn(r) for r in rows)

    def iter_rollouts(self) -> Iterator[Rollout]:
        for row in self.db.execute(f"SELECT {ROLLOUT_COLUMNS} FROM rollouts ORDER BY created"):
            yield row_rollout(row)

    def outcomes(self) -> list[Outcome]:
        rows = self.db.execute("SELECT outcome FROM outcomes ORDER BY harness, task, sample")
        return [msgspec.json.decode(row[0], type=Outcome) for row in rows]

    def turn_counts(self) -> dict[str, int]:
        return dict(self.db.execute("SELECT rollout, COUNT(*) FROM turns GROUP BY rollout"))

    def count_turns(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM turns").fetchone()[0]

    def integrity_check(self) -> str:
        return self.db.execute("PRAGMA integrity_check").fetchone()[0]


class WriterLock:
    """The store's write lock across processes: an exclusive `flock` on RUN_DIR/trace.db-writer,
    held from BEGIN to COMMIT. The kernel hands it to the next waiter the moment it is
    released. A separate file, because closing any descriptor of the database itself would
    drop SQLite's own POSIX locks in this process."""

    def __init__(self, db_path: Path) -> None:
        self.path = db_path.with_name(db_path.name + "-writer")
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def __enter__(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *_exc: object) -> None:
        self.release()

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def acquire_now(self) -> bool:
        """Takes the lock if no other process holds it; never waits."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def close(self) -> None:
        os.close(self._fd)


class TraceStore(TraceReader):
    """The writer of one run's store, and a reader of it: `with TraceStore(run_dir) as
    store:`. Writes go through `add_turn` / `put_rollout` / `put_outcome`, awaited until
    committed; leaving the block (or `close`) drains the queue and stops the threads."""

    def __init__(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(run_dir)
        # Opened here, not on the writer thread: a lock file that cannot be made fails the
        # store's construction with its reason, never a writer thread that dies unseen.
        self._writer_lock = WriterLock(self.path)
        # One connection writes, from the writer thread or from `_commit_here`; `_writing`
        # lets one of them at a time use it (and the lock file, whose flock is per file
        # description, so it cannot tell two threads of this process apart).
        self._db: sqlite3.Connection | None = connect(self.path)
        # The WAL is folded back by `_checkpoint_loop`, off the commit path: an automatic
        # checkpoint inside a commit stalls every turn waiting on it for milliseconds.
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._writing = threading.Lock()
        self._queue: queue.SimpleQueue[_Write | None] = queue.SimpleQueue()
        # Held while a write is queued and while `close` queues the writer's end, so no
        # write lands behind the end (where nothing would ever commit it).
        self._queueing = threading.Lock()
        self._ended = False  # the writer's end is queued
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
    async def add_turn(self, turn: Turn, *, alone: bool = False) -> None:
        """Returns once `turn` is committed. `alone`: the caller's is the only call in
        flight, so nothing else waits on this event loop while it commits."""
        if not alone:  # the row is packed on the writer thread, off the event loop
            await self._submit(INSERT_TURN, lambda: turn_row(turn))
            return
        row = _pack(INSERT_TURN, lambda: turn_row(turn))
        if isinstance(row, Exception):
            raise row
        if not self._commit_here(row):
            await self._submit(INSERT_TURN, lambda: row[1])

    async def put_rollout(self, rollout: Rollout) -> None:
        await self._submit(INSERT_ROLLOUT, lambda: rollout_params(rollout))

    async def put_outcome(self, outcome: Outcome) -> None:
        """The rollout's final result; a retried rollout replaces its earlier attempt."""
        await self._submit(INSERT_OUTCOME, lambda: outcome_params(outcome))

    async def _submit(self, sql: str, params: Callable[[], tuple[Any, ...]]) -> None:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._queueing:
            if self._ended:  # no writer is left to commit it: fail, never wait
                raise sqlite3.ProgrammingError("the trace store is closed")
            self._queue.put(_Write(sql, params, loop, future))
        await future

    def _commit_here(self, row: tuple[str, tuple[Any, ...]]) -> bool:
        """Commits `row` on the caller's thread when the writer is idle, nothing is
        queued and no other process is writing; False (nothing done) otherwise. At c=1
        the hand-off to the writer thread and back, two thread wake-ups, cost about as
        much as the commit itself (~0.2 ms); under load the queue's group commit is
        cheaper, and the event loop must not wait on another process's lock."""
        if not self._queue.empty() or not self._writing.acquire(blocking=False):
            return False
        try:
            if self._db is None or not self._writer_lock.acquire_now():
                return False
            try:
                error = self._apply(self._db, [row])[0]
            finally:
                self._writer_lock.release()
            self._note_written([row])
        finally:
            self._writing.release()
        if error is not None:
            raise error
        return True

    def _write_loop(self) -> None:
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
            self._settle(batch, self._commit(batch))
        with self._writing:
            if self._db is not None:
                self._db.close()
                self._db = None
            self._writer_lock.close()

    def _commit(self, batch: list[_Write]) -> list[Exception | None]:
        """Each write's error (None: committed)."""
        packed = [_pack(w.sql, w.params) for w in batch]
        rows = [p for p in packed if not isinstance(p, Exception)]
        with self._writing, self._writer_lock:
            assert self._db is not None  # closed only when this thread ends
            done = self._apply(self._db, rows)
            self._note_written(rows)
        committed = iter(done)
        return [p if isinstance(p, Exception) else next(committed) for p in packed]

    @staticmethod
    def _settle(batch: list[_Write], results: list[Exception | None]) -> None:
        """Wakes the writers' event loops, once `_writing` is free again: a caller that
        runs the moment its turn is committed finds the writer idle (`_commit_here`)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Any, Exception | None]]] = {}
        for write, error in zip(batch, results, strict=True):
            by_loop.setdefault(write.loop, []).append((write.future, error))
        for loop, settled in by_loop.items():  # one wake-up per loop, not one per turn
            loop.call_soon_threadsafe(_settle_all, settled)

    def _apply(self, db: sqlite3.Connection, rows: list[tuple[str, tuple[Any, ...]]]
               ) -> list[Exception | None]:
        """`rows` in one transaction, each row's error (None: committed); the caller
        holds the writer lock."""
        try:
            db.execute("BEGIN IMMEDIATE")
            for sql, params in rows:
                db.execute(sql, params)
            db.execute("COMMIT")
            return [None] * len(rows)
        except sqlite3.Error as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            if len(rows) == 1:  # its own error: run again alone, it would only fail again
                return [exc]
            return [self._commit_one(db, sql, params) for sql, params in rows]

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
            with self._queueing:
                self._ended = True
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


def _pack(sql: str, params: Callable[[], tuple[Any, ...]]
          ) -> tuple[str, tuple[Any, ...]] | Exception:
    """The row to write, or why it cannot be: a row that fails to pack fails alone, as a
    store error its caller reports, and the writer thread goes on."""
    try:
        return sql, params()
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

