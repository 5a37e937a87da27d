"""The trace store: durable, exact, and safe across a killed proxy."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import pyarrow.parquet as pq
import pytest

from harnessrl.proxy.engines.vllm_server import free_port
from harnessrl.store.reader import TraceReader
from harnessrl.store.rows import pack, unpack
from harnessrl.store.writer import TraceStore, WriterLock
from harnessrl.train.export.rollouts import export
from harnessrl.types import Rollout
from tests.helpers import make_turn


def test_packed_arrays_round_trip_exactly() -> None:
    values = (-1.2345678901234567, -0.0, -1e-300, float("-inf"))
    assert unpack(pack(values, "d"), "d") == values
    assert unpack(pack((0, 151_642, 2**31 - 1), "i"), "i") == (0, 151_642, 2**31 - 1)
    assert pack(None, "i") is None and unpack(None, "i") is None


def test_turns_round_trip_under_concurrent_writes(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)

    async def write() -> None:
        await store.put_rollout(Rollout("k", 0.0))
        await asyncio.gather(*(store.add_turn(make_turn("k", i)) for i in range(200)))

    asyncio.run(write())
    turns = store.turns("k")
    assert [t.index for t in turns] == list(range(200))
    assert turns[7] == make_turn("k", 7)
    assert store.next_index("k") == 200
    store.close()


def wal_commits(db: Path) -> int:
    """Transactions in the database's write-ahead log, read from the file itself: in
    SQLite's WAL format a frame whose header holds a database size ends a commit."""
    wal = (db.parent / f"{db.name}-wal").read_bytes()
    page_size, salts = struct.unpack(">I", wal[8:12])[0], wal[16:24]
    frame = 24 + page_size
    commits = 0
    for offset in range(32, len(wal) - frame + 1, frame):
        if wal[offset + 8:offset + 16] != salts:  # left over from before a reset
            break
        commits += struct.unpack(">I", wal[offset + 4:offset + 8])[0] != 0
    return commits


def test_queued_writes_share_a_commit(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    asyncio.run(store.put_rollout(Rollout("k", 0.0)))
    before = wal_commits(store.path)
    # Another connection holds the write lock while 200 writes are queued behind it.
    blocker = sqlite3.connect(store.path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")

    async def write() -> None:
        pending = [asyncio.ensure_future(store.add_turn(make_turn("k", i)))
                   for i in range(200)]
        await asyncio.sleep(0)  # each has queued its write and waits for the commit
        blocker.execute("COMMIT")
        await asyncio.gather(*pending)

    asyncio.run(write())
    blocker.close()
    # The writer may have taken the first few before it met the lock; the rest go in one.
    grouped = wal_commits(store.path) - before
    assert 1 <= grouped <= 2 and store.count_turns() == 200

    async def one_by_one() -> None:  # the count is of transactions: awaited writes add one each
        for i in range(200, 203):
            await store.add_turn(make_turn("k", i))

    asyncio.run(one_by_one())
    assert wal_commits(store.path) - before == grouped + 3
    store.close()


def test_writers_take_turns_on_the_lock_file_not_sqlites_busy_wait(tmp_path: Path) -> None:
    """While another writer (another worker process, here this test) holds the store's
    writer lock, queued turns are not committed; they are the moment it is released."""
    store = TraceStore(tmp_path)
    asyncio.run(store.put_rollout(Rollout("k", 0.0)))
    other = WriterLock(store.path)
    assert other.path == tmp_path / "trace.db-writer"

    async def write() -> None:
        with other:
            pending = asyncio.gather(*(store.add_turn(make_turn("k", i)) for i in range(50)))
            await asyncio.sleep(0.3)
            with TraceReader(tmp_path, up_to_date=True) as reader:
                assert reader.count_turns() == 0  # SQLite alone would have let them in
            assert not pending.done()
        await asyncio.wait_for(pending, 5)

    asyncio.run(write())
    other.close()
    assert store.count_turns() == 50
    store.close()


def test_a_turn_alone_is_committed_on_the_callers_thread(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The only call in flight skips the writer thread's two hand-offs; its errors are
    still its own (a duplicate index), and the store takes queued writes as before."""
    store = TraceStore(tmp_path)
    threads: list[str] = []
    apply = store._apply

    def spy(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return apply(*args)

    monkeypatch.setattr(store, "_apply", spy)

    async def write() -> None:
        await store.put_rollout(Rollout("k", 0.0))
        await store.add_turn(make_turn("k", 0), alone=True)
        with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
            await store.add_turn(make_turn("k", 0), alone=True)
        wide = make_turn("k", 2)  # an id past 32 bits: never stored wrapped
        assert wide.completion is not None
        replace = msgspec.structs.replace
        completion = replace(wide.completion, tokens=replace(wide.completion.tokens,
                                                             completion_ids=(2**31,)))
        with pytest.raises(sqlite3.DataError, match="cannot pack"):
            await store.add_turn(replace(wide, completion=completion), alone=True)
        await store.add_turn(make_turn("k", 1))

    asyncio.run(write())
    # The row is packed where it is committed (against the rollout's latest turns), so
    # the bad id fails inside its own commit, on the caller's thread.
    assert threads == ["trace-writer", "MainThread", "MainThread", "MainThread",
                       "trace-writer"]
    assert store.turns("k") == [make_turn("k", 0), make_turn("k", 1)]
    store.close()


def test_a_turn_alone_never_waits_on_another_writer_on_the_event_loop(tmp_path: Path) -> None:
    """Another process holding the writer lock: the turn goes to the writer thread's queue,
    and the event loop keeps running while it waits."""
    store = TraceStore(tmp_path)
    asyncio.run(store.put_rollout(Rollout("k", 0.0)))
    other = WriterLock(store.path)
    other.__enter__()
    valve = threading.Timer(1.5, other.release)  # so a loop held by the lock fails, not hangs
    valve.start()

    async def write() -> None:
        pending = asyncio.ensure_future(store.add_turn(make_turn("k", 0), alone=True))
        start = time.monotonic()
        for _ in range(10):
            await asyncio.sleep(0.02)
        assert time.monotonic() - start < 1.0  # the loop never waited on the lock
        assert not pending.done() and store.count_turns() == 0
        other.release()
        await asyncio.wait_for(pending, 5)

    asyncio.run(write())
    valve.cancel()
    other.close()
    assert store.count_turns() == 1
    store.close()


def test_a_writer_lock_that_cannot_be_opened_fails_the_store_at_once(tmp_path: Path) -> None:
    """Not a writer thread that dies unseen, leaving every add_turn waiting forever."""
    (tmp_path / "trace.db-writer").mkdir()
    with pytest.raises(IsADirectoryError):
        TraceStore(tmp_path)


def test_duplicate_turn_index_is_refused_without_harming_others(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)

    async def write() -> list:
        await store.put_rollout(Rollout("k", 0.0))
        await store.add_turn(make_turn("k", 0))
        return await asyncio.gather(store.add_turn(make_turn("k", 0)),
                                    store.add_turn(make_turn("k", 1)), return_exceptions=True)

    dup, ok = asyncio.run(write())
    assert "UNIQUE" in str(dup) and ok is None
    assert [t.index for t in store.turns("k")] == [0, 1]
    store.close()


def test_a_lone_row_that_fails_is_run_once_and_a_group_retries_each_row(tmp_path: Path
                                                                         ) -> None:
    """A group that fails is retried row by row; a group of one is not run again (it
    would only fail again)."""
    store = TraceStore(tmp_path)
    inserts: list[str] = []
    assert store._db is not None
    store._db.set_trace_callback(lambda sql: inserts.append(sql)
                                 if sql.startswith("INSERT INTO turns") else None)

    async def write(*indexes: int) -> list[BaseException | None]:
        return await asyncio.gather(*(store.add_turn(make_turn("k", i)) for i in indexes),
                                    return_exceptions=True)

    asyncio.run(store.put_rollout(Rollout("k", 0.0)))
    asyncio.run(write(0))
    inserts.clear()
    (dup,) = asyncio.run(write(0))
    assert isinstance(dup, sqlite3.IntegrityError) and len(inserts) == 1
    inserts.clear()
    dup, ok = asyncio.run(write(0, 1))
    assert isinstance(dup, sqlite3.IntegrityError) and ok is None
    # One group (the duplicate fails it at once, then each row alone: 3), or two groups of
    # one, as the writer thread happened to take them (2).
    assert len(inserts) in (2, 3)
    assert [t.index for t in store.turns("k")] == [0, 1]
    store.close()


def test_a_row_that_cannot_be_packed_fails_alone_and_the_writer_goes_on(tmp_path: Path
                                                                         ) -> None:
    store = TraceStore(tmp_path)

    async def write() -> list:
        await store.put_rollout(Rollout("k", 0.0))
        # metadata msgspec cannot encode: packing fails on the writer thread
        bad = store.put_rollout(Rollout("bad", 0.0, metadata={"x": object()}))
        return await asyncio.gather(bad, store.add_turn(make_turn("k", 0)),
                                    return_exceptions=True)

    bad, ok = asyncio.run(write())
    assert isinstance(bad, sqlite3.DataError) and "cannot pack" in str(bad) and ok is None
    asyncio.run(store.add_turn(make_turn("k", 1)))  # the writer thread is still alive
    assert [t.index for t in store.turns("k")] == [0, 1] and store.rollout("bad") is None
    store.close()


def test_export_jsonl_and_parquet(tmp_path: Path) -> None:
    async def write(store: TraceStore) -> None:
        await store.put_rollout(Rollout("k", 0.0))
        for i in range(3):
            await store.add_turn(make_turn("k", i))

    with TraceStore(tmp_path) as store:
        asyncio.run(write(store))
    assert export(tmp_path, tmp_path / "t.jsonl") == 3
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert rows[1]["prompt_ids"] == list(range(101))
    assert rows[2]["logprobs"] == list(make_turn("k", 2).completion.tokens.logprobs)
    assert json.loads(rows[0]["request"])["messages"][0]["parts"][0]["text"] == "hi"
    assert export(tmp_path, tmp_path / "t.parquet", fmt="parquet") == 3
    table = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert table[1]["completion_ids"] == [0, 1, 2] and table[0]["raw_request"] == '{"x": 1}'
    assert export(tmp_path, tmp_path / "r.parquet", what="rollouts", fmt="parquet") == 1
    assert pq.read_table(tmp_path / "r.parquet").to_pylist()[0]["turns"] == 3


def start_proxy(run_dir: Path, tiny_model: Path, script: Path, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "harnessrl.cli", "serve", "--scripted", str(tiny_model),
           "--script", str(script), "--run-dir", str(run_dir), "--port", str(port)]
    process = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240  # `serve` starts a worker per core
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError(process.stderr.read().decode())


@pytest.mark.slow
def test_sigkill_loses_no_finished_turn_and_resume_continues(tmp_path: Path, tiny_model) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["one two three", "four five"]))
    port = free_port()
    process = start_proxy(tmp_path / "run", tiny_model, script, port)
    key = httpx.post(f"http://127.0.0.1:{port}/rollouts", json={}).json()["key"]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/r/{key}/v1", api_key=key,
                           max_retries=0)
    n = 6
    for i in range(n):
        create = dict(model="m", messages=[{"role": "user", "content": f"call {i}"}],
                      stream=i % 2 == 1)
        result = client.chat.completions.create(**create)
        if create["stream"]:
            list(result)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()

    with TraceReader(tmp_path / "run") as store:
        assert store.integrity_check() == "ok"
        turns = store.turns(key)
    assert [t.index for t in turns] == list(range(n))
    assert all(t.status == "ok" and t.completion.tokens.completion_ids for t in turns)

    process = start_proxy(tmp_path / "run", tiny_model, script, port)
    try:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
        turns = httpx.get(f"http://127.0.0.1:{port}/rollouts/{key}").json()["turns"]
        assert [t["index"] for t in turns] == list(range(n + 1))
    finally:
        process.terminate()
        process.wait(10)


# ------------------------------------------------------------------ reader, schema, errors
def test_the_reader_starts_no_thread(tmp_path: Path) -> None:
    with TraceStore(tmp_path) as store:
        asyncio.run(store.put_rollout(Rollout("k", 0.0)))
        asyncio.run(store.add_turn(make_turn("k", 0)))
    before = set(threading.enumerate())
    with TraceReader(tmp_path) as reader:  # an up-to-date file: opened, never written
        assert [t.index for t in reader.turns("k")] == [0]
        assert reader.rollout("k") == Rollout("k", 0.0) and reader.count_turns() == 1
        assert list(export_rows(reader)) and set(threading.enumerate()) == before
    fresh = TraceReader(_mkdir(tmp_path / "new"))  # creates and migrates, still no thread
    assert fresh.outcomes() == [] and set(threading.enumerate()) == before
    fresh.close()


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def export_rows(reader: TraceReader):
    from harnessrl.train.export.rollouts import turn_row

    return (turn_row(t) for t in reader.iter_turns())


# The tables as SCHEMA_VERSION 2 made them (before outcomes had columns of their own and
# before turns carried their error kind).
_VERSION_2 = """
CREATE TABLE rollouts (key TEXT PRIMARY KEY, created REAL NOT NULL, closed REAL,
    sampling BLOB, unset_sampling TEXT NOT NULL DEFAULT '[]',
    metadata BLOB NOT NULL DEFAULT '{}');
CREATE TABLE turns (id INTEGER PRIMARY KEY, rollout TEXT NOT NULL REFERENCES rollouts(key),
    idx INTEGER NOT NULL, dialect TEXT NOT NULL, status TEXT NOT NULL, received REAL NOT NULL,
    first_token REAL, done REAL, engine TEXT, model TEXT, weight_version TEXT, error TEXT,
    flags TEXT NOT NULL DEFAULT '[]', requested_sampling BLOB, used_sampling BLOB,
    request BLOB, completion BLOB, prompt_ids BLOB, completion_ids BLOB, logprobs BLOB,
    raw_request BLOB NOT NULL, raw_response BLOB NOT NULL, reply_id TEXT,
    UNIQUE (rollout, idx));
CREATE INDEX turns_by_reply ON turns (rollout, reply_id);
CREATE TABLE outcomes (harness TEXT NOT NULL, task TEXT NOT NULL, sample INTEGER NOT NULL,
    rollout TEXT NOT NULL, status TEXT NOT NULL, reward REAL, outcome BLOB NOT NULL,
    PRIMARY KEY (harness, task, sample));
CREATE INDEX turns_by_model ON turns (model);
CREATE INDEX outcomes_by_rollout ON outcomes (rollout);
CREATE INDEX rollouts_by_created ON rollouts (created);
PRAGMA user_version = 2;
"""


def _version_2_store(run_dir: Path) -> None:
    import msgspec

    from harnessrl.types import Outcome

    solved = Outcome(harness="h", harness_version="7", task="t", sample=0, rollout="k0",
                     status="done", reward=1.0, verifier_reward=1.0, tool_calls=3,
                     completion_tokens=40)
    failed = Outcome(harness="h", harness_version="7", task="t", sample=1, rollout="k1",
                     status="done", reward=0.0, verifier_reward=0.0)  # 0 tool calls: omitted
    db = sqlite3.connect(run_dir / "trace.db", isolation_level=None)
    db.executescript(_VERSION_2)
    for key, created in (("k0", 1.0), ("k1", 2.0), ("k2", 3.0)):
        db.execute("INSERT INTO rollouts (key, created, metadata) VALUES (?, ?, ?)",
                   (key, created, b'{"harness": "h", "task": "t", "sample": 9}'))
    turns = [("k1", 0, "ok", None), ("k1", 1, "failed", "timeout: no reply in 30 s"),
             ("k2", 0, "failed", "engine_unavailable: connection refused: port 1"),
             ("k2", 1, "failed", "no colon here")]
    for key, idx, status, error in turns:
        db.execute("INSERT INTO turns (rollout, idx, dialect, status, received, error,"
                   " raw_request, raw_response) VALUES (?, ?, 'openai_chat', ?, 1.0, ?, x'',"
                   " x'')", (key, idx, status, error))
    for o in (solved, failed):
        db.execute("INSERT INTO outcomes VALUES (?, ?, ?, ?, ?, ?, ?)",
                   (o.harness, o.task, o.sample, o.rollout, o.status, o.reward,
                    msgspec.json.encode(o)))
    db.close()


def test_a_version_2_store_gets_the_new_columns_filled(tmp_path: Path) -> None:
    from harnessrl.store.schema import SCHEMA_VERSION
    from harnessrl.ui.queries import Filters, RunReader

    _version_2_store(tmp_path)
    with TraceReader(tmp_path) as reader:
        kinds = {(t.rollout, t.index): t.error_kind for key in ("k1", "k2")
                 for t in reader.turns(key)}
        columns = reader.db.execute(
            "SELECT rollout, harness_version, verifier_reward, tool_calls, completion_tokens"
            " FROM outcomes ORDER BY rollout").fetchall()
        meta = reader.db.execute("SELECT key, harness, task FROM rollouts ORDER BY key")
        assert meta.fetchall() == [("k0", "h", "t"), ("k1", "h", "t"), ("k2", "h", "t")]
        assert reader.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert kinds == {("k1", 0): None, ("k1", 1): "timeout", ("k2", 0): "engine_unavailable",
                     ("k2", 1): "no colon here"}
    assert columns == [("k0", "7", 1.0, 3, 40), ("k1", "7", 0.0, 0, 0)]
    viewer = RunReader(tmp_path)  # and the viewer filters on them
    assert [r["key"] for r in viewer.rollouts(Filters(state="passed"))["rows"]] == ["k0"]
    assert [r["key"] for r in viewer.rollouts(Filters(harness="h", task="t"))["rows"]] == [
        "k2", "k1", "k0"]
    [stats] = viewer.harness_stats()
    assert (stats["version"], stats["passed"], stats["tool_calls_per_solved"]) == ("7", 1, 3)
    viewer.close()


def test_error_kind_round_trips_and_new_rows_fill_the_columns(tmp_path: Path) -> None:
    import msgspec

    from harnessrl.types import Outcome

    failed = msgspec.structs.replace(make_turn("k", 1), status="failed",
                                     error="engine_error: boom: 500", error_kind="engine_error")
    with TraceStore(tmp_path) as store:
        async def write() -> None:
            await store.put_rollout(Rollout("k", 0.0, metadata={"harness": "h", "task": 5}))
            await store.add_turn(make_turn("k", 0))
            await store.add_turn(failed)
            await store.put_outcome(Outcome(harness="h", harness_version="2", task="5",
                                            sample=0, rollout="k", status="done",
                                            verifier_reward=0.5, tool_calls=2))

        asyncio.run(write())
        assert store.turns("k") == [make_turn("k", 0), failed]
        assert store.turns("k")[1].error_kind == "engine_error"
    with TraceReader(tmp_path) as reader:
        assert reader.turn_by_reply("k", "none") is None
        assert [t.error_kind for t in reader.iter_turns()] == [None, "engine_error"]
        assert reader.db.execute("SELECT harness, task FROM rollouts").fetchall() == [("h", 5)]
        assert reader.db.execute("SELECT harness_version, verifier_reward, tool_calls,"
                                 " completion_tokens FROM outcomes").fetchall() == [
            ("2", 0.5, 2, 0)]
    assert export(tmp_path, tmp_path / "t.jsonl") == 2
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [r["error_kind"] for r in rows] == [None, "engine_error"]


def test_a_closed_store_refuses_writes_and_still_reads(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    asyncio.run(store.put_rollout(Rollout("k", 0.0)))
    store.close()
    store.close()  # a second close does nothing
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        asyncio.run(store.add_turn(make_turn("k", 0)))
    assert store.rollout("k") == Rollout("k", 0.0)
    store.close()


def test_a_write_while_the_store_closes_fails_instead_of_waiting_forever(tmp_path: Path
                                                                        ) -> None:
    """`close` has queued the writer's end and waits for the writer, busy with an earlier
    turn: a write now is refused at once, and the earlier turn is still committed."""
    store = TraceStore(tmp_path)
    asyncio.run(store.put_rollout(Rollout("k", 0.0)))
    store._writing.acquire()  # the writer thread will wait here, inside its commit
    first = threading.Thread(target=lambda: asyncio.run(store.add_turn(make_turn("k", 0))))
    first.start()
    closing = threading.Thread(target=store.close)
    try:
        time.sleep(0.2)  # the writer has taken the first turn
        closing.start()
        deadline = time.monotonic() + 5
        while not store._ended and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store._ended and closing.is_alive()  # close() waits on the busy writer

        async def late() -> None:
            await asyncio.wait_for(store.add_turn(make_turn("k", 1)), 2)

        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            asyncio.run(late())
    finally:
        store._writing.release()
    first.join(10)
    closing.join(10)
    assert not closing.is_alive() and [t.index for t in store.turns("k")] == [0]
