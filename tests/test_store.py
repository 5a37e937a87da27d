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
import time
from pathlib import Path

import httpx
import openai
import pyarrow.parquet as pq
import pytest

from harnessrl.proxy.engines.vllm_server import free_port
from harnessrl.proxy.store import TraceStore, pack, unpack
from harnessrl.train.export import export
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
    store = TraceStore(tmp_path)

    async def write() -> None:
        await store.put_rollout(Rollout("k", 0.0))
        for i in range(3):
            await store.add_turn(make_turn("k", i))

    asyncio.run(write())
    store.close()
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
    deadline = time.monotonic() + 60
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

    store = TraceStore(tmp_path / "run")
    assert store.integrity_check() == "ok"
    turns = store.turns(key)
    assert [t.index for t in turns] == list(range(n))
    assert all(t.status == "ok" and t.completion.tokens.completion_ids for t in turns)
    store.close()

    process = start_proxy(tmp_path / "run", tiny_model, script, port)
    try:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
        turns = httpx.get(f"http://127.0.0.1:{port}/rollouts/{key}").json()["turns"]
        assert [t["index"] for t in turns] == list(range(n + 1))
    finally:
        process.terminate()
        process.wait(10)
