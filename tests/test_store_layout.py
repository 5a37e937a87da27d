"""The store's delta layout (issue 35): a turn is stored as what is new against an earlier
turn of its rollout, and every reader gets back exactly what was written."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.store import layout as layout_module
from harnessrl.store.delta import CorruptTurn, decode_body, encode_body, shared_prefix
from harnessrl.store.layout import encode, prepare
from harnessrl.store.reader import TraceReader
from harnessrl.store.rows import INSERT_TURN
from harnessrl.store.schema import SCHEMA_VERSION
from harnessrl.store.writer import TraceStore
from harnessrl.types import (
    ChatRequest,
    Completion,
    Message,
    Outcome,
    Rollout,
    Sampling,
    Text,
    Timings,
    Tokens,
    Tool,
    Turn,
)

FIXTURE = Path(__file__).parent / "fixtures" / "store_v4"


# ------------------------------------------------------------------ a rollout's turns
def chat_turn(key: str, index: int, messages: tuple[Message, ...], prompt: tuple[int, ...],
              reply: tuple[int, ...], logprobs: tuple[float, ...], *, status: str = "ok",
              reply_id: str | None = None) -> Turn:
    raw = json.dumps({"model": "m", "messages": [[m.role, repr(m.parts)] for m in messages],
                      "tools": [{"name": "bash"}], "temperature": 0.5}).encode()
    request = ChatRequest("m", messages, tools=(Tool("bash", "runs"),),
                          sampling=Sampling(temperature=0.5))
    completion = Completion("m", (Text(f"reply {index}"),), "stop", None,
                            Tokens(prompt, reply, logprobs))
    return Turn(key, index, "openai_chat", status, Timings(1.0 + index, None, 2.0 + index),  # type: ignore[arg-type]
                raw, b"data: {\"n\": %d}\n\ndata: [DONE]\n\n" % index, request, completion,
                reply_id=reply_id)


def conversation(key: str, turns: int, grow: int = 200) -> list[Turn]:
    made, messages, prompt = [], (), ()
    for i in range(turns):
        text = f"user {i}: " + "x y z " * (grow // 6)
        messages += (Message("user", (Text(text),)),)
        prompt += tuple(text.encode())
        reply = tuple(range(1000 + i, 1010 + i))
        made.append(chat_turn(key, i, messages, prompt, reply,
                              tuple(-1.0 / (k + 1) for k in range(len(reply))),
                              reply_id=f"chatcmpl-{i}"))
        messages += (Message("assistant", (Text(f"reply {i}"),)),)
        prompt += reply
    return made


async def write(store: TraceStore, turns: list[Turn]) -> None:
    for turn in turns:
        await store.add_turn(turn)


def layout(run_dir: Path) -> list[tuple]:
    db = sqlite3.connect(run_dir / "trace.db")
    try:
        return db.execute("SELECT idx, layout, prompt_parent, prompt_keep, body_base,"
                          " length(prompt_ids), length(raw_request) FROM turns"
                          " ORDER BY rollout, idx").fetchall()
    finally:
        db.close()


def test_a_growing_rollout_is_stored_as_deltas_and_reads_back_exactly(tmp_path: Path) -> None:
    turns = conversation("k", 12, grow=4000)
    with TraceStore(tmp_path) as store:
        asyncio.run(write(store, turns))
        assert store.turns("k") == turns
    rows = layout(tmp_path)
    assert [r[2] for r in rows] == [None, *range(11)]  # each extends the one before
    assert all(r[1] == 1 for r in rows)
    # What a later turn stores does not grow with its context: its ~4,000 new ids and
    # bytes (and the reply's), where its whole raw request is 12 times that.
    assert rows[-1][5] <= 4 * 4_100 and rows[-1][6] <= 4_100, rows[-1]
    assert len(turns[-1].raw_request) > 12 * 4_000
    with TraceReader(tmp_path) as reader:
        assert reader.turns("k", 5, 3) == turns[5:8]
        assert reader.turn("k", 9) == turns[9]
        assert reader.turn_by_reply("k", "chatcmpl-7") == turns[7]
        assert list(reader.iter_turns()) == turns
        ids_only = reader.turns("k", bodies=False)
        assert [t.completion for t in ids_only] == [t.completion for t in turns]
        assert all(t.raw_request == b"" and t.request is None for t in ids_only)


# ------------------------------------------------------------------ schema v4 files
def test_a_v4_store_opens_and_reads_the_same(tmp_path: Path) -> None:
    expected = msgspec.json.decode((FIXTURE / "turns_v4.json").read_bytes(), type=list[Turn])
    shutil.copy(FIXTURE / "trace.db", tmp_path / "trace.db")
    read_only = tmp_path / "untouched"
    read_only.mkdir()
    shutil.copy(FIXTURE / "trace.db", read_only / "trace.db")
    # Read as it is, without migrating (a store the reader may not write to).
    with TraceReader(read_only, up_to_date=True) as reader:
        assert reader.turns("a") + reader.turns("b") == expected
    with TraceStore(tmp_path) as store:
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert store.turns("a") + store.turns("b") == expected
        assert list(store.iter_turns()) == expected
        assert store.turn_by_reply("a", "chatcmpl-2") == expected[2]
        assert store.outcomes()[0].reward == 1.0
        assert store.rollout("a") is not None and store.rollout("a").max_model_calls == 8  # type: ignore[union-attr]
        # A turn appended after the upgrade extends a v4 turn: stored against it.
        last = expected[3]
        assert last.completion is not None
        tokens = last.completion.tokens
        assert tokens.prompt_ids is not None and tokens.completion_ids is not None
        new = chat_turn("a", 6, last.request.messages if last.request else (),
                        tokens.prompt_ids + tokens.completion_ids + (7, 7), (9,), (-0.25,))
        asyncio.run(store.add_turn(new))
        assert store.turns("a")[6] == new
    assert layout(tmp_path)[6][1:3] == (1, 3)
    with TraceReader(tmp_path) as reader:
        assert reader.turns("a") == [*expected[:6], new]


# ------------------------------------------------------------------ random rollouts
ids = st.lists(st.integers(0, 2**31 - 1), max_size=12).map(tuple)
logprob = st.floats(allow_nan=False, width=64)
KINDS = ("extend", "extend", "extend", "retry", "rewrite", "side", "failed", "cancelled",
         "restart", "empty")


@st.composite
def rollouts(draw: st.DrawFn) -> list[tuple[str, int, tuple[int, ...], bytes]]:
    """Steps: (kind, which earlier turn it builds on, new ids, new body bytes)."""
    return draw(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 50), ids,
                                   st.binary(max_size=40)), min_size=1, max_size=14))


def build(steps: list[tuple[str, int, tuple[int, ...], bytes]], key: str) -> list[Turn | None]:
    """Turns as a harness and engine would make them; None marks a restart."""
    made: list[Turn | None] = []
    done: list[Turn] = []
    for n, (kind, pick, new, body) in enumerate(steps):
        if kind == "restart":
            made.append(None)
            continue
        index = len(done)
        base = done[pick % len(done)] if done else None
        before = base.completion.tokens if base and base.completion else None
        prompt, messages = new, (Message("user", (Text(body.hex()),)),)
        if kind in ("extend", "retry", "cancelled") and before is not None and before.prompt_ids:
            prompt = before.prompt_ids + ((before.completion_ids or ()) if kind != "retry"
                                          else ()) + new
            assert base is not None and base.request is not None
            messages = base.request.messages + messages
        reply = tuple(x ^ n for x in new[:5]) or (n,)
        lps = tuple(-abs(float(x)) / 7 for x in reply)
        turn = chat_turn(key, index, messages, prompt, reply, lps, reply_id=f"r{index}")
        if kind == "failed":  # refused before the engine: raw bytes only
            turn = Turn(key, index, "anthropic", "failed", Timings(5.0), body, b"",
                        error="bad_request: no", error_kind="bad_request")
        elif kind == "cancelled":
            turn = msgspec.structs.replace(turn, status="cancelled", raw_response=b"")
        elif kind == "side":  # an unrelated short call in the same rollout
            turn = msgspec.structs.replace(turn, raw_request=b'{"summarize": "' + body + b'"}')
        elif kind == "empty":
            turn = msgspec.structs.replace(turn, raw_request=b"", completion=None,
                                           request=None)
        made.append(turn)
        done.append(turn)
    return made


def write_with_restarts(run_dir: Path, plan: list[list[Turn | None]]) -> None:
    """Each rollout's turns in order, rollouts interleaved; a restart closes the store and
    opens a new one (its memory of the latest turns is gone)."""
    store = TraceStore(run_dir)
    try:
        for step in range(max(len(p) for p in plan)):
            batch = [p[step] for p in plan if step < len(p)]
            if any(t is None for t in batch):
                store.close()
                store = TraceStore(run_dir)
            turns = [t for t in batch if t is not None]

            async def go(turns: list[Turn] = turns, store: TraceStore = store) -> None:
                if len(turns) == 1:  # alone: committed on this thread; else grouped
                    await store.add_turn(turns[0], alone=True)
                else:
                    await asyncio.gather(*(store.add_turn(t) for t in turns))
            asyncio.run(go())
    finally:
        store.close()


@settings(max_examples=60)
@given(st.lists(rollouts(), min_size=1, max_size=3))
def test_random_rollouts_read_back_exactly(tmp_path_factory: pytest.TempPathFactory,
                                           plans: list[list[tuple[str, int, tuple[int, ...],
                                                                  bytes]]]) -> None:
    run_dir = tmp_path_factory.mktemp("store")
    plan = [build(steps, f"k{n}") for n, steps in enumerate(plans)]
    write_with_restarts(run_dir, plan)
    written = {f"k{n}": [t for t in p if t is not None] for n, p in enumerate(plan)}
    with TraceReader(run_dir) as reader:
        for key, turns in written.items():
            assert reader.turns(key) == turns
            for turn in turns:
                assert reader.turn(key, turn.index) == turn
            ids_only = reader.turns(key, bodies=False)
            assert [t.completion and t.completion.tokens for t in ids_only] == [
                t.completion and t.completion.tokens for t in turns]
        assert list(reader.iter_turns()) == [t for k in sorted(written) for t in written[k]]


# ------------------------------------------------------------------ bad input
def test_a_corrupt_delta_fails_its_read_naming_the_turn(tmp_path: Path) -> None:
    turns = conversation("k", 8)
    other = conversation("o", 3)
    with TraceStore(tmp_path) as store:
        asyncio.run(write(store, turns + other))
    db = sqlite3.connect(tmp_path / "trace.db")
    blob = bytearray(db.execute("SELECT raw_request FROM turns WHERE rollout = 'k' AND idx = 5"
                                ).fetchone()[0])
    blob[4] ^= 0x01
    db.execute("UPDATE turns SET raw_request = ? WHERE rollout = 'k' AND idx = 5", (bytes(blob),))
    db.commit()
    db.close()
    with TraceReader(tmp_path) as reader:
        with pytest.raises(CorruptTurn, match="rollout 'k' turn 5: cannot be rebuilt: checksum"):
            reader.turns("k")
        with pytest.raises(CorruptTurn, match="turn 5"):
            reader.turn("k", 7)  # stored against turn 5, directly or not
        assert reader.turns("k", 0, 5) == turns[:5]
        assert reader.turns("o") == other
        assert reader.turns("k", bodies=False)[7].completion == turns[7].completion
    with TraceStore(tmp_path) as store:  # the rollout still takes new turns, whole
        extra = conversation("k", 9)[8]
        asyncio.run(store.add_turn(extra))
        assert store.turns("k", 8) == [extra]


def test_a_missing_parent_or_wrong_length_fails_naming_the_turn(tmp_path: Path) -> None:
    turns = conversation("k", 6)
    with TraceStore(tmp_path) as store:
        asyncio.run(write(store, turns))
    db = sqlite3.connect(tmp_path / "trace.db")
    db.execute("UPDATE turns SET prompt_len = prompt_len + 1 WHERE idx = 1")
    db.execute("DELETE FROM turns WHERE idx = 3")
    db.commit()
    db.close()
    with TraceReader(tmp_path) as reader:
        with pytest.raises(CorruptTurn, match="turn 1: its prompt rebuilds to"):
            reader.turn("k", 1)
        with pytest.raises(CorruptTurn, match="turn 4: its prompt's parent turn 3 is missing"):
            reader.turns("k", 3, 1)
        assert reader.turn("k", 0) == turns[0]


def test_body_deltas_are_byte_exact() -> None:
    base = b'{"messages": [1, 2], "tools": []}'
    for body in (base, b"", b'{"messages": [1, 2, 3], "tools": []}', b"x" + base, base + b"x",
                 b'{"messages": [1], "tools": []}', bytes(range(256)) * 3):
        blob, _ = encode_body(body, base)
        assert decode_body(blob, lambda: base) == body
    assert shared_prefix(b"abcdef", b"abcxef") == 3
    assert shared_prefix(b"", b"abc") == 0


def test_rollout_records_and_outcomes_are_untouched(tmp_path: Path) -> None:
    with TraceStore(tmp_path) as store:
        async def go() -> None:
            await store.put_rollout(Rollout("k", 1.0, metadata={"task": "t"}))
            await store.put_outcome(Outcome("h", "1", "t", 0, "k", "done", reward=0.5))
        asyncio.run(go())
        assert store.rollout("k") == Rollout("k", 1.0, metadata={"task": "t"})
        assert store.outcomes()[0].reward == 0.5


def test_a_forgotten_rollout_is_read_back_from_the_store(tmp_path: Path) -> None:
    """With no room in memory, each rollout's next turn finds its parent in the store."""
    a, b = conversation("a", 5), conversation("b", 5)
    with TraceStore(tmp_path) as store:
        store._recent._floor = 1  # every other rollout is forgotten at each write
        for pair in zip(a, b, strict=True):
            asyncio.run(write(store, list(pair)))
        assert store.turns("a") == a and store.turns("b") == b
    assert [r[2] for r in layout(tmp_path)] == [None, 0, 1, 2, 3] * 2


def test_a_cancelled_turn_reads_cancelled_from_memory_too(tmp_path: Path) -> None:
    turns = conversation("k", 2)
    with TraceStore(tmp_path) as store:
        asyncio.run(write(store, turns))

        async def cancel() -> None:
            await store.cancel_turn("k", 1)
        asyncio.run(cancel())
        cached = store.turn_by_reply("k", "chatcmpl-1")
        assert cached is not None and cached.status == "cancelled"
        assert store.turns("k")[1] == cached


# ------------------------------------------------------------------ the parent, found early
def changed_inside(turn: Turn) -> Turn:
    """`turn` with its second prompt id changed: the same length and the same first and
    last ids as before (what the cheap probes look at), a prompt that extends no turn."""
    assert turn.completion is not None and turn.completion.tokens.prompt_ids is not None
    tokens = turn.completion.tokens
    prompt = list(tokens.prompt_ids)  # type: ignore[arg-type]
    prompt[1] += 1
    completion = msgspec.structs.replace(turn.completion, tokens=msgspec.structs.replace(
        tokens, prompt_ids=tuple(prompt)))
    return msgspec.structs.replace(turn, completion=completion)


def test_a_prompt_that_differs_inside_its_parents_ids_is_stored_whole(tmp_path: Path) -> None:
    turns = conversation("k", 3)
    wrong = changed_inside(turns[2])
    with TraceStore(tmp_path) as store:
        asyncio.run(write(store, [*turns[:2], wrong]))
        assert store.turns("k") == [*turns[:2], wrong]
    rows = layout(tmp_path)
    assert [r[2] for r in rows] == [None, 0, None]  # turn 2 extends neither: whole
    with TraceReader(tmp_path) as reader:
        assert reader.turn("k", 2) == wrong


def parent_of(row: tuple | None) -> int | None:
    assert row is not None
    return row[-4]  # `encode`'s row ends with layout, parent, keep, length, base


def test_a_row_encoded_before_its_commit_holds_only_against_the_same_turns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn's row is encoded before the commit (outside the write lock); the commit
    takes it only if the rollout's latest turns are the very objects it was encoded
    against, and encodes the turn again otherwise: never a row made against other ids."""
    first, second, third = conversation("k", 3)
    ready = prepare(third, [first, second])
    assert ready.row == encode(third, [first, second]) and parent_of(ready.row) == 1
    assert ready.row_against([first, second]) is ready.row
    # A kept turn replaced by an object with other ids, or merely another object.
    assert ready.row_against([first, changed_inside(second)]) is None
    assert ready.row_against([first, msgspec.structs.replace(second)]) is None
    assert ready.row_against([second]) is None and ready.row_against([]) is None
    assert prepare(third, None).row is None  # the rollout is not in memory
    encoded: list[Turn] = []
    real = layout_module.encode
    monkeypatch.setattr(layout_module, "encode",
                        lambda turn, *rest: encoded.append(turn) or real(turn, *rest))
    with TraceStore(tmp_path) as store:
        asyncio.run(write(store, [first]))
        early = store._recent.prepare(third)  # against turn 0 alone
        assert parent_of(early.row) == 0
        ready = store._recent.prepare(second)
        encoded.clear()
        assert store._commit_here((INSERT_TURN, ready))
        assert encoded == []  # nothing committed since: the row made before is taken
        assert store._commit_here((INSERT_TURN, early))
        assert encoded == [third]  # turn 1 committed since: encoded again, against it
        assert store.turns("k") == [first, second, third]
    assert [r[2] for r in layout(tmp_path)] == [None, 0, 1]


# Sealing and unsealing from many threads at once, as the writer thread, readers in worker
# threads and a Ray node's threads do: zstd contexts shared across threads corrupted data
# ("Data corruption detected" on read) and could crash the process, so it runs apart.
_THREADS = r"""
import os, random, threading
from harnessrl.store import delta
payloads = [os.urandom(2000) * 50 + os.urandom(3000) for _ in range(16)]
blobs = [delta.seal(delta.WHOLE, (), p, compress=True) for p in payloads]
errors = []
def work(seed):
    pick = random.Random(seed)
    for _ in range(300):
        i = pick.randrange(16)
        try:
            assert delta.unseal(blobs[i], 0)[2] == payloads[i]
            again = delta.seal(delta.WHOLE, (), payloads[i], compress=True)
            assert delta.unseal(again, 0)[2] == payloads[i]
        except Exception as error:
            errors.append(repr(error))
threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(len(errors), errors[:2])
"""


def test_sealing_from_many_threads_at_once_reads_back_exactly() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _THREADS], capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "0 []"), done.stderr[-1000:]
