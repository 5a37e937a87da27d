"""The reads of one run's trace store (`TraceReader`): one SQLite file (WAL) per run
directory, read without starting a thread, by the viewer, exports, reports and the runner.
A turn is stored as what is new against an earlier turn of its rollout (`store.layout`,
docs/store.md): the reads here rebuild it whole, exactly. The writer (`store.writer`) is a
reader too: the proxy reads what it wrote.
"""

from __future__ import annotations

import sqlite3
import sys
import threading
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Self

import msgspec

from harnessrl.store.delta import CorruptTurn
from harnessrl.store.layout import Decoder, decode_each
from harnessrl.store.rows import (
    LAYOUT_COLUMNS,
    READ_COLUMNS,
    ROLLOUT_COLUMNS,
    TURN_COLUMNS,
    V6_COLUMNS,
    row_rollout,
)
from harnessrl.store.schema import DB_NAME, connect, migrate
from harnessrl.types import Outcome, Rollout, Turn


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
        self._columns: str | None = None

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

    @property
    def columns(self) -> str:
        """What a turn is read with: `READ_COLUMNS`, or NULL for v5's layout columns in a
        v4 file that could not be brought up to date (read-only): its rows are all whole."""
        if self._columns is None:
            have = {r[1] for r in self.db.execute("PRAGMA table_info(turns)")}
            columns = READ_COLUMNS if "layout" in have else (
                f"{TURN_COLUMNS}, {', '.join(['NULL'] * len(LAYOUT_COLUMNS.split(',')))}")
            for column in V6_COLUMNS:  # v6's, likewise NULL in an older read-only file
                if column not in have:
                    columns = columns.replace(column, f"NULL AS {column}", 1)
            self._columns = columns
        return self._columns

    def turns(self, key: str, offset: int = 0, limit: int = -1, *,
              bodies: bool = True) -> list[Turn]:
        """The rollout's turns in order, from the `offset`-th, at most `limit` (-1: all).
        The turns before the page are read too (a turn is stored against earlier ones),
        but only their small deltas. `bodies=False`: raw bodies and requests are left
        unread (b"" and None), for readers of the ids only."""
        # Capped: offset + limit past sys.maxsize is a legal page (empty), not an error.
        stop = None if limit < 0 else min(offset + limit, sys.maxsize)
        return _raised(islice(self._decoded(key, bodies), offset, stop))

    def turns_from(self, key: str, first: int, limit: int) -> list[Turn]:
        """At most `limit` of the rollout's turns whose index is `first` or more."""
        wanted = (t for t in self._decoded(key, True) if t.index >= first)
        return _raised(islice(wanted, limit))

    def _decoded(self, key: str, bodies: bool) -> Iterator[Turn | CorruptTurn]:
        # Every row fetched at once (deltas: small): a cursor left open by a reader that
        # stops early would hold its read transaction, and its snapshot, open.
        rows = self.db.execute(
            f"SELECT {self.columns} FROM turns WHERE rollout = ? ORDER BY idx", (key,)).fetchall()
        return decode_each(rows, bodies=bodies)

    def turn(self, key: str, index: int) -> Turn | None:
        rows = self.db.execute(
            f"SELECT {self.columns} FROM turns WHERE rollout = ? AND idx <= ? ORDER BY idx",
            (key, index)).fetchall()
        if not rows or rows[-1][1] != index:
            return None
        *_, last = decode_each(rows)
        return _raised([last])[0]

    def turn_by_reply(self, key: str, reply_id: str) -> Turn | None:
        row = self.db.execute("SELECT idx FROM turns WHERE rollout = ? AND reply_id = ?",
                              (key, reply_id)).fetchone()
        return None if row is None else self.turn(key, row[0])

    def iter_turns(self, batch: int = 256, *, bodies: bool = True) -> Iterator[Turn]:
        """Every turn, by rollout then index."""
        cursor = self.db.execute(f"SELECT {self.columns} FROM turns ORDER BY rollout, idx")
        decoder, current = Decoder(bodies=bodies), None
        while rows := cursor.fetchmany(batch):
            for row in rows:
                if row[0] != current:
                    decoder, current = Decoder(bodies=bodies), row[0]
                yield decoder.add(row)

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


def _raised(turns: Iterable[Turn | CorruptTurn]) -> list[Turn]:
    """The turns a reader asked for; the first that cannot be rebuilt fails the read."""
    out = []
    for turn in turns:
        if isinstance(turn, CorruptTurn):
            raise turn
        out.append(turn)
    return out
