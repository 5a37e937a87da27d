"""Prompt ids stored against the longest shared prefix (issue 49, item 2): a turn whose
history was rewritten (a dropped turn, an edited system prompt, reasoning removed, tools
rendered after the messages) keeps what it shares with a recent turn of its rollout and
stores only the rest; every field reads back exactly, and a damaged delta fails its read
naming the turn."""

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

from harnessrl.errors import StoreCorrupt
from harnessrl.store.delta import CorruptTurn
from harnessrl.store.layout import CANDIDATES, MIN_KEPT
from harnessrl.store.reader import TraceReader
from harnessrl.store.writer import TraceStore
from harnessrl.types import ChatRequest, Completion, Message, Text, Timings, Tokens, Turn

FIXTURE = Path(__file__).parent / "fixtures" / "store_v5_extend"

# ------------------------------------------------------------------ rewritten histories
# What a harness does to the history it resends, each step: extend it (the reply and a new
# message), drop an earlier message, edit the system prompt, strip the last reply's
# reasoning, move the tools from before the messages to after them (or back), retry the
# same call, or make an unrelated side call.
OPS = ("extend", "extend", "extend", "drop", "system", "reasoning", "tools", "retry", "side")
segment = st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=10).map(tuple)
Step = tuple[str, int, tuple[int, ...], tuple[int, ...]]


@st.composite
def histories(draw: st.DrawFn) -> list[Step]:
    """Steps: (op, which message it touches, a new message's ids, the reply's ids)."""
    return draw(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 99), segment,
                                   segment), min_size=1, max_size=14))


def make_turn(key: str, index: int, messages: list[tuple[int, ...]], prompt: tuple[int, ...],
              reasoning: tuple[int, ...], answer: tuple[int, ...]) -> Turn:
    texts = tuple(Message("user" if n % 2 == 0 else "assistant", (Text(repr(m)),))
                  for n, m in enumerate(messages))
    raw = json.dumps({"model": "m", "messages": [repr(m) for m in messages]}).encode()
    sampled = reasoning + answer
    logprobs = tuple(-(x % 997) / 13.0 for x in sampled)
    completion = Completion("m", (Text(repr(answer)),), "stop", None,
                            Tokens(prompt, sampled, logprobs))
    return Turn(key, index, "openai_chat", "ok", Timings(1.0 + index, None, 2.0 + index), raw,
                b"data: %d\n\n" % index, ChatRequest("m", texts), completion,
                reply_id=f"r{index}")


def build(steps: list[Step], key: str) -> list[Turn]:
    """The turns of one rollout whose history is rewritten as `steps` say; a prompt is
    the system prompt, the messages (a reply with its reasoning unless stripped) and the
    tools, before or after the messages."""
    system, tools, tools_after = (11, 12, 13, 14), (90, 91, 92), False
    messages: list[tuple[int, ...]] = []
    answers: list[tuple[int, ...]] = []  # each kept reply's ids without its reasoning
    turns: list[Turn] = []
    for index, (op, pick, new, reply) in enumerate(steps):
        if op == "drop" and messages:
            del messages[pick % len(messages)]
        elif op == "system":
            system = system[:2] + new
        elif op == "reasoning" and answers:
            messages[-1] = answers[-1]
        elif op == "tools":
            tools_after = not tools_after
        if op == "retry" and turns:
            previous = turns[-1].completion.tokens.prompt_ids  # type: ignore[union-attr]
            assert previous is not None
            prompt = previous
        elif op == "side":
            prompt = new
        else:
            messages.append(new)
            body = system + tuple(x for m in messages for x in m)
            prompt = body + tools if tools_after else tools + body
        reasoning = tuple(x ^ 5 for x in reply[: pick % 4])
        turns.append(make_turn(key, index, messages, prompt, reasoning, reply))
        if op not in ("retry", "side"):
            messages.append(reasoning + reply)
            answers.append(reply)
    return turns


def expected_parent(turns: list[Turn], n: int) -> tuple[int | None, int]:
    """The parent the store should pick, the slow way: the latest of the last CANDIDATES
    turns whose ids (prompt, then completion) the prompt shares the most leading ids with."""
    prompt = turns[n].completion.tokens.prompt_ids  # type: ignore[union-attr]
    assert prompt is not None
    best, keep = None, 0
    for earlier in reversed(turns[max(0, n - CANDIDATES):n]):
        tokens = earlier.completion.tokens  # type: ignore[union-attr]
        full = (tokens.prompt_ids or ()) + (tokens.completion_ids or ())
        shared = 0
        while shared < min(len(prompt), len(full)) and prompt[shared] == full[shared]:
            shared += 1
        if shared > keep:
            best, keep = earlier.index, shared
    return (best, keep) if keep >= MIN_KEPT else (None, 0)


def rows(run_dir: Path, key: str) -> list[tuple]:
    db = sqlite3.connect(run_dir / "trace.db")
    try:
        return db.execute("SELECT prompt_parent, prompt_keep, prompt_len, length(prompt_ids)"
                          " FROM turns WHERE rollout = ? ORDER BY idx", (key,)).fetchall()
    finally:
        db.close()


async def write(store: TraceStore, turns: list[Turn]) -> None:
    for turn in turns:
        await store.add_turn(turn)


@settings(max_examples=80, deadline=None)
@given(histories(), histories())
def test_rewritten_histories_keep_the_longest_shared_prefix_and_read_back_exactly(
        tmp_path_factory: pytest.TempPathFactory, first: list[Step], second: list[Step]) -> None:
    run_dir = tmp_path_factory.mktemp("store")
    written = {"a": build(first, "a"), "b": build(second, "b")}
    with TraceStore(run_dir) as store:  # two rollouts, their turns interleaved
        for n in range(max(map(len, written.values()))):
            asyncio.run(write(store, [t[n] for t in written.values() if n < len(t)]))
    with TraceReader(run_dir) as reader:
        for key, turns in written.items():
            assert reader.turns(key) == turns
            assert [reader.turn(key, t.index) for t in turns] == turns
            assert reader.turns(key, bodies=False) == [msgspec.structs.replace(
                t, raw_request=b"", raw_response=b"", request=None) for t in turns]
            for n, (parent, keep, length, size) in enumerate(rows(run_dir, key)):
                assert (parent, keep or 0) == expected_parent(turns, n), n
                assert length == len(turns[n].completion.tokens.prompt_ids)  # type: ignore[union-attr, arg-type]
                assert size == 4 * (length - (keep or 0)) + 6  # only the ids after the kept
        assert list(reader.iter_turns()) == written["a"] + written["b"]


def history(turns: int, *, rewrite: bool) -> list[Turn]:
    """A chat whose history grows 300 ids a turn; `rewrite`: each prompt ends with a
    reminder of 20 ids that the next one no longer has (a prompt that shares all but the
    reminder with the last, never extending it)."""
    made, body = [], tuple(range(50))
    for n in range(turns):
        body += tuple(1000 + 300 * n + k for k in range(300))
        prompt = body + (tuple(range(7000 + n, 7020 + n)) if rewrite else ())
        reply = tuple(range(500 + n, 520 + n))
        made.append(make_turn("k", n, [body], prompt, (), reply))
        body += reply
    return made


def test_a_rewritten_history_stores_what_changed_not_the_context(tmp_path: Path) -> None:
    extends, rewritten = history(12, rewrite=False), history(12, rewrite=True)
    with TraceStore(tmp_path / "x") as store:
        asyncio.run(write(store, extends))
    with TraceStore(tmp_path / "r") as store:
        asyncio.run(write(store, rewritten))
        assert store.turns("k") == rewritten
    # Exact extension: the parent's prompt and reply kept, 300 new ids stored.
    assert [r[:2] for r in rows(tmp_path / "x", "k")][1:] == [
        (n, 50 + 320 * (n + 1)) for n in range(11)]
    # Rewritten: the parent's prompt kept up to its reminder; the reply, 300 new ids and
    # the new reminder stored: 340 ids, not the whole prompt of up to 3,890.
    got = rows(tmp_path / "r", "k")
    assert [r[:2] for r in got][1:] == [(n, 50 + 320 * (n + 1) - 20) for n in range(11)]
    assert all(r[3] == 4 * 340 + 6 for r in got[1:]), got


def test_a_corrupt_prefix_delta_fails_its_read_naming_the_turn(tmp_path: Path) -> None:
    turns = history(6, rewrite=True)
    with TraceStore(tmp_path) as store:
        asyncio.run(write(store, turns))
    db = sqlite3.connect(tmp_path / "trace.db")
    blob = bytearray(db.execute("SELECT prompt_ids FROM turns WHERE idx = 3").fetchone()[0])
    blob[10] ^= 0x40  # one bit of a stored id
    db.execute("UPDATE turns SET prompt_ids = ? WHERE idx = 3", (bytes(blob),))
    db.execute("UPDATE turns SET prompt_keep = 99999 WHERE idx = 1")  # past its parent's ids
    db.commit()
    db.close()
    with TraceReader(tmp_path) as reader:
        with pytest.raises(CorruptTurn, match="'k' turn 3: cannot be rebuilt: checksum") as got:
            reader.turn("k", 3)
        assert isinstance(got.value, StoreCorrupt) and got.value.index == 3
        with pytest.raises(StoreCorrupt, match="'k' turn 1: keeps 99999 ids of parent turn 0"):
            reader.turn("k", 1)
        with pytest.raises(CorruptTurn, match="turn 2: its prompt's parent turn 1 cannot be"):
            reader.turns("k", 2, 1)  # stored against turn 1
        assert reader.turn("k", 0) == turns[0]


# ------------------------------------------------------------------ an older file
def test_a_store_written_by_the_previous_layout_reads_the_same(tmp_path: Path) -> None:
    """`fixtures/store_v5_extend` was written by the layout before this one (a parent only
    for an exact extension; main at 5e3d0e0): it reads back exactly, and a rewritten turn
    appended to it is stored against the longest shared prefix."""
    expected = msgspec.json.decode((FIXTURE / "turns.json").read_bytes(), type=list[Turn])
    shutil.copy(FIXTURE / "trace.db", tmp_path / "trace.db")
    assert [r[0] for r in rows(tmp_path, "k")] == [None, 0, 1, 1, 1, None]
    with TraceStore(tmp_path) as store:
        assert store.turns("k") == expected
        last = expected[-1].completion.tokens.prompt_ids  # type: ignore[union-attr]
        assert last is not None
        new = make_turn("k", 6, [last[:-20]], (*last[:-20], 1, 2, 3), (), (4,))
        asyncio.run(store.add_turn(new))
    assert rows(tmp_path, "k")[6][:2] == (5, len(last) - 20)
    with TraceReader(tmp_path) as reader:
        assert reader.turns("k") == [*expected, new]
