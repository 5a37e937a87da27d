"""The writer of one run's trace store: one SQLite file (WAL) per run directory.

`TraceStore` is the writer (a reader too, `store.reader.TraceReader`: the proxy reads what
it wrote), a context manager: writes go through one writer thread that commits whatever is
queued as one transaction (group commit), so many concurrent turns cost one fsync between
them, and `add_turn` returns only once its turn is committed. The one call in flight
(`add_turn(alone=True)`) commits its turn itself when that writer is idle: the hand-off
to the thread and back costs as much as the commit. Writers in several processes
(`serve --workers N`) take turns on a lock file beside the store (`WriterLock`) rather than
on SQLite's busy handler, which sleeps 1, 2, 5, 10 ms... between tries: under load that
sleeping left cores idle and held every turn's last byte. Token ids and logprobs are
stored as packed little-endian arrays (int32, float64), not JSON. A turn is stored as
what is new against an earlier turn of its rollout (`store.layout`, docs/store.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.store.delta import CorruptTurn
from harnessrl.store.layout import Prepared, Recent, Staged, decode_rollout
from harnessrl.store.reader import TraceReader
from harnessrl.store.rows import (
    INSERT_OUTCOME,
    INSERT_ROLLOUT,
    INSERT_TURN,
    outcome_params,
    rollout_params,
)
from harnessrl.store.schema import connect
from harnessrl.types import Outcome, Rollout, Turn

CANCEL_TURN = ("UPDATE turns SET status = 'cancelled'"
               " WHERE rollout = ? AND idx = ? AND status = 'ok'")
# Fold the WAL back into the database after about this much has been written to it.
CHECKPOINT_BYTES = 8 * 1024 * 1024


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
        # The rollouts' latest committed turns, which a new turn is stored against.
        self._recent = Recent(self._load_recent)
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
        # The row is stored against the rollout's latest committed turns (`store.layout`)
        # and encoded here, before the write lock: its compares with them follow the
        # context, and under the lock they would hold every other writer. The commit
        # takes it if those turns are still the latest, else encodes the turn again.
        write = self._recent.prepare(turn)
        if not alone or not self._commit_here((INSERT_TURN, write)):
            await self._submit(INSERT_TURN, lambda: write)

    async def cancel_turn(self, key: str, index: int) -> None:
        """A turn committed `ok` whose reply its client never got whole (it left before the
        last byte was handed over): `cancelled`, as if it had left earlier. Turns of any
        other status are left as they are."""
        await self._submit(CANCEL_TURN, lambda: (key, index))
        self._recent.cancel(key, index)  # what `turn_by_reply` answers from memory too

    async def put_rollout(self, rollout: Rollout) -> None:
        """An open rollout widens the memory of recent turns by its share; a closed one's
        turns are dropped from it (`layout.Recent`)."""
        await self._submit(INSERT_ROLLOUT, lambda: rollout_params(rollout))
        if rollout.closed is None:
            self._recent.opened(rollout.key)
        else:
            self._recent.closed(rollout.key)

    async def put_outcome(self, outcome: Outcome) -> None:
        """The rollout's final result; a retried rollout replaces its earlier attempt.
        Its rollout is done: its turns leave the memory of recent turns."""
        await self._submit(INSERT_OUTCOME, lambda: outcome_params(outcome))
        if outcome.rollout:
            self._recent.closed(outcome.rollout)

    def kept(self) -> tuple[int, int]:
        """The memory of recent turns: (rollouts kept, what their turns weigh in bytes)."""
        return self._recent.size()

    async def _submit(self, sql: str, params: Callable[[], _Params]) -> None:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._queueing:
            if self._ended:  # no writer is left to commit it: fail, never wait
                raise sqlite3.ProgrammingError("the trace store is closed")
            self._queue.put(_Write(sql, params, loop, future))
        await future

    def _commit_here(self, row: _Row) -> bool:
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
        packed = [_call(w) for w in batch]
        rows = [p for p in packed if not isinstance(p, Exception)]
        with self._writing, self._writer_lock:
            assert self._db is not None  # closed only when this thread ends
            done = self._apply(self._db, rows)
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

    def _apply(self, db: sqlite3.Connection, rows: list[_Row]) -> list[Exception | None]:
        """`rows` in one transaction, each row's error (None: committed); the caller
        holds the writer lock."""
        staged = self._recent.stage()
        try:
            db.execute("BEGIN IMMEDIATE")
            for sql, params in rows:
                db.execute(sql, self._params(db, staged, params))
            db.execute("COMMIT")
            staged.keep()
            return [None] * len(rows)
        except sqlite3.Error as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            if len(rows) == 1:  # its own error: run again alone, it would only fail again
                return [exc]
            return [self._commit_one(db, sql, params) for sql, params in rows]

    def _commit_one(self, db: sqlite3.Connection, sql: str, params: _Params
                    ) -> Exception | None:
        """After a failed group, each write alone: one bad row must not sink the others."""
        staged = self._recent.stage()
        try:
            db.execute(sql, self._params(db, staged, params))
        except sqlite3.Error as exc:
            return exc
        staged.keep()
        return None

    def _params(self, db: sqlite3.Connection, staged: Staged, params: _Params
                ) -> tuple[Any, ...]:
        """A write's parameters: a turn is encoded against its rollout's latest turns."""
        if isinstance(params, Turn | Prepared):
            write = params
            params = _pack(lambda: staged.encode(db, write))
        self._note_written(params)
        return params

    def _load_recent(self, db: sqlite3.Connection, key: str) -> list[Turn]:
        """A rollout's turns as stored, for `Recent` (after a restart, or once it was
        forgotten): a rollout whose old turns cannot be rebuilt gets new turns whole."""
        rows = db.execute(f"SELECT {self.columns} FROM turns WHERE rollout = ? ORDER BY idx",
                          (key,)).fetchall()
        try:
            return decode_rollout(rows)
        except CorruptTurn:
            return []

    def turn_by_reply(self, key: str, reply_id: str) -> Turn | None:
        """From memory when it is one of the rollout's latest turns (a chained reply
        usually is), else from the store."""
        turn = self._recent.find(key, lambda t: t.reply_id == reply_id)
        return turn if turn is not None else super().turn_by_reply(key, reply_id)

    def _note_written(self, params: tuple[Any, ...]) -> None:
        self._wal_bytes += sum(len(v) for v in params if isinstance(v, bytes | str))
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


# A write: its SQL and parameters, or the turn to encode into them (`store.layout`),
# possibly encoded already (`Prepared`).
_Params = tuple[Any, ...] | Turn | Prepared
_Row = tuple[str, _Params]


@dataclass(frozen=True, slots=True)
class _Write:
    sql: str
    params: Callable[[], _Params]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


def _pack(params: Callable[[], tuple[Any, ...]]) -> tuple[Any, ...]:
    """The row to write, or a store error saying why it cannot be packed (an id out of
    int32 range): that row fails alone and its caller reports it."""
    try:
        return params()
    except Exception as exc:
        error = sqlite3.DataError(f"cannot pack the row: {type(exc).__name__}: {exc}")
        raise error from exc


def _call(write: _Write) -> _Row | Exception:
    """The write's row, or why its parameters could not be made."""
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

