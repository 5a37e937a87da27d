"""Chains and samples: hand-built turns with known answers, properties of chains built by
construction, and a real conversation captured through the proxy."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path
from typing import get_args

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from harnessrl.proxy.engines.scripted import Reply, ScriptedEngine
from harnessrl.reports import render_report
from harnessrl.rollout.analysis.chains import (
    BREAK_REASONS,
    EXCLUDE_REASONS,
    ChainStats,
    build_report,
    chains,
    common_prefix,
    link,
    report,
)
from harnessrl.train.rows.samples import iter_samples, sample, samples_for_rollout
from harnessrl.types import (
    BreakReason,
    ChainBreak,
    Completion,
    ExcludedTurn,
    ExcludeReason,
    Rollout,
    Timings,
    Tokens,
    Turn,
)
from tests.dialects import Chat
from tests.helpers import REPLIES, ServedProxy, make_proxy


def make_turn(index: int, prompt, completion, logprobs=None, *, status="ok", flags=(),
              weight_version=None, rollout="r1") -> Turn:
    if logprobs is None:  # distinct values, so misplaced logprobs show
        logprobs = [-(index + 1) - k / 100 for k in range(len(completion))]
    tokens = Tokens(tuple(prompt), tuple(completion), tuple(logprobs))
    return Turn(rollout=rollout, index=index, dialect="openai_chat", status=status,
                timings=Timings(0.0), raw_request=b"{}", flags=tuple(flags),
                weight_version=weight_version, error="engine: boom" if status != "ok" else None,
                completion=None if status != "ok" else Completion(
                    model="m", parts=(), finish_reason="stop", usage=None, tokens=tokens))


SYSTEM = (1, 2, 3, 4, 5, 6)
P0 = (*SYSTEM, 7, 8)
C0 = (10, 11)
P1 = (*P0, *C0, 20, 21, 22)
C1 = (12,)
P2 = (*P1, *C1, 23)
C2 = (13, 14, 15)


def three_turns(**kwargs) -> list[Turn]:
    return [make_turn(0, P0, C0, [-0.1, -0.2], weight_version="v1", **kwargs),
            make_turn(1, P1, C1, [-0.3], weight_version="v1", **kwargs),
            make_turn(2, P2, C2, [-0.4, -0.5, -0.6], weight_version="v2", **kwargs)]


# ------------------------------------------------------------------ hand-built turns
def test_clean_three_turn_chain_is_one_sample_with_exact_mask_and_logprobs() -> None:
    [chain] = chains(three_turns())
    assert chain.start == ChainBreak("first", 0)
    s = sample(chain)
    assert s.rollout == "r1" and s.turns == (0, 1, 2)
    assert s.prompt_ids == P0
    assert s.completion_ids == (10, 11, 20, 21, 22, 12, 23, 13, 14, 15)
    assert s.mask == (1, 1, 0, 0, 0, 1, 0, 1, 1, 1)
    assert s.logprobs == (-0.1, -0.2, -0.3, -0.4, -0.5, -0.6)
    dense = s.dense_logprobs()
    assert [v for v, m in zip(dense, s.mask, strict=True) if m] == list(s.logprobs)
    assert all(math.isnan(v) for v, m in zip(dense, s.mask, strict=True) if not m)
    assert s.dense_logprobs(fill=0.0)[2:5] == [0.0, 0.0, 0.0]
    assert s.weight_versions == ("v1", "v1", "v2") and s.break_reason is None


def test_turn_order_comes_from_the_index_not_the_list() -> None:
    [chain] = chains(list(reversed(three_turns())))
    assert [t.index for t in chain.turns] == [0, 1, 2]


def test_interleaved_side_call_is_its_own_chain() -> None:
    side_prompt = (1, 90, 91, 92)  # shares one template token with the main system prompt
    turns = [make_turn(0, P0, C0), make_turn(1, side_prompt, (95, 96)),
             make_turn(2, P1, C1), make_turn(3, (*side_prompt, 95, 96, 97), (98,)),
             make_turn(4, P2, C2)]
    main, side = chains(turns)
    assert [t.index for t in main.turns] == [0, 2, 4]
    assert [t.index for t in side.turns] == [1, 3]
    assert side.start == ChainBreak("side_call", 1, against=0, diverged_at=1, within="prompt",
                                    within_turn=0)
    samples = samples_for_rollout(turns)
    assert [s.break_reason for s in samples] == [None, "side_call"]
    assert samples[0].completion_ids == sample(chains(three_turns())[0]).completion_ids
    assert samples[1].completion_ids == (95, 96, 97, 98) and samples[1].mask == (1, 1, 0, 1)


def test_prompt_extending_two_chains_joins_the_longest() -> None:
    # Turn 1 repeats turn 0's prompt with more text: both chains are open when turn 2
    # arrives, and turn 2 extends both; it belongs to the closer (longer) one.
    turns = [make_turn(0, (1, 2, 3, 4), (5,)), make_turn(1, (1, 2, 3, 4, 5, 6), (7,)),
             make_turn(2, (1, 2, 3, 4, 5, 6, 7, 8), (9,))]
    assert [[t.index for t in c.turns] for c in chains(turns)] == [[0, 1, 2]]
    turns[1] = make_turn(1, (1, 2, 3, 4), (5, 6))  # a rewound retry: now a second chain
    first, retry = chains(turns)
    assert [t.index for t in first.turns] == [0]
    assert retry.start == ChainBreak("rewound", 1, against=0, diverged_at=4,
                                     within="completion", within_turn=0)
    assert [t.index for t in retry.turns] == [1, 2]  # (1..4)+(5,6) is longer than (1..4)+(5,)


def test_completion_resent_differently_breaks_inside_that_completion() -> None:
    drifted = (*P0, 10, 99, 20, 21, 22)  # turn 0's second sampled id re-tokenized as 99
    first, second = chains([make_turn(0, P0, C0), make_turn(1, drifted, C1)])
    assert [t.index for t in first.turns] == [0]
    assert second.start == ChainBreak("history_rewritten", 1, against=0,
                                      diverged_at=len(P0) + 1, within="completion",
                                      within_turn=0)
    assert sample(second).prompt_ids == drifted


def test_compacted_tool_result_breaks_inside_the_inserted_tokens() -> None:
    compacted = (*P0, *C0, 20, 77, *C1, 23)  # the tool result after turn 0 was shortened
    turns = [*three_turns()[:2], make_turn(2, compacted, C2)]
    first, second = chains(turns)
    assert [t.index for t in first.turns] == [0, 1]
    assert second.start == ChainBreak("history_rewritten", 2, against=1,
                                      diverged_at=len(P0) + len(C0) + 1, within="prompt",
                                      within_turn=1)
    assert samples_for_rollout(turns)[1].break_reason == "history_rewritten"


@pytest.mark.parametrize(("status", "flags", "reason", "detail"), [
    ("failed", (), "failed", "engine: boom"),
    ("cancelled", (), "cancelled", "engine: boom"),
    ("ok", ("logprob_count_mismatch",), "flagged", "logprob_count_mismatch"),
])
def test_unusable_middle_turn_is_excluded_and_its_tokens_masked(status, flags, reason,
                                                                detail) -> None:
    turns = three_turns()
    turns[1] = make_turn(1, P1, C1, status=status, flags=flags)
    linked = link(turns)
    assert linked.excluded == [ExcludedTurn(1, reason, detail)]
    [chain] = linked.chains
    s = sample(chain)
    assert s.turns == (0, 2)
    # Turn 2 still extends turn 0 through the left-out turn, whose sampled id is inserted.
    assert s.completion_ids == (10, 11, 20, 21, 22, 12, 23, 13, 14, 15)
    assert s.mask == (1, 1, 0, 0, 0, 0, 0, 1, 1, 1)
    assert s.logprobs == (-0.1, -0.2, -0.4, -0.5, -0.6)


def test_an_informational_flag_keeps_the_turn_trainable() -> None:
    turns = three_turns()
    turns[1] = make_turn(1, P1, C1, [-0.3], flags=("render_fallback",))
    [chain] = chains(turns)
    assert sample(chain).turns == (0, 1, 2)
    turns[1] = make_turn(1, P1, C1, [-0.3], flags=("render_fallback", "prompt_ids_changed"))
    assert [t.detail for t in link(turns).excluded] == ["prompt_ids_changed"]


def test_turn_without_logprobs_is_excluded() -> None:
    turn = make_turn(0, P0, C0)
    bare = Turn(**{**{f: getattr(turn, f) for f in Turn.__struct_fields__}, "completion":
                   Completion("m", (), "stop", None, Tokens(P0, C0, None))})
    assert link([bare]).excluded == [ExcludedTurn(0, "no_tokens")]
    assert samples_for_rollout([bare]) == []


def test_turns_that_do_not_extend_each_other_are_refused() -> None:
    [chain] = chains(three_turns())
    broken = type(chain)((chain.turns[0], chain.turns[2]), chain.start)
    assert sample(broken).turns == (0, 2)  # extension is transitive
    bad = type(chain)((chain.turns[0], make_turn(1, (*P0, 10, 12), C1)), chain.start)
    with pytest.raises(ValueError, match="turn 1 does not extend turn 0"):
        sample(bad)


def test_turns_of_several_rollouts_are_refused() -> None:
    with pytest.raises(ValueError, match="one rollout"):
        link([make_turn(0, P0, C0), make_turn(1, P1, C1, rollout="r2")])


@pytest.mark.parametrize(("a", "b", "n"), [((), (), 0), ((1, 2, 3), (1, 2, 3, 4), 3),
                                            ((1, 2, 3), (1, 5, 3), 1), ((7,), (8,), 0),
                                            (tuple(range(1000)), (*range(999), -1), 999)])
def test_common_prefix(a, b, n) -> None:
    assert common_prefix(a, b) == common_prefix(b, a) == n


def test_every_reason_link_gives_is_documented_and_each_documented_one_occurs() -> None:
    bare = make_turn(7, P0, C0)  # its completion has ids but no logprobs
    bare = Turn(**{**{f: getattr(bare, f) for f in Turn.__struct_fields__}, "completion":
                   Completion("m", (), "stop", None, Tokens(P0, C0, None))})
    linked = link([
        make_turn(0, P0, C0),
        make_turn(1, (1, 90, 91), (95,)),  # another conversation
        make_turn(2, (*P0, 10, 99), C1),  # turn 0's completion sent back differently
        make_turn(3, P0, (10, 12)),  # turn 0's prompt again: a regenerated reply
        make_turn(4, P1, C1, status="failed"),
        make_turn(5, P1, C1, status="cancelled"),
        make_turn(6, P1, C1, flags=("logprob_count_mismatch",)),
        bare,
        make_turn(8, P1, C1, status="failed"),  # its client sent it again: turn 9
        Turn(**{**{f: getattr(make_turn(9, P1, C1, status="cancelled"), f)
                   for f in Turn.__struct_fields__}, "retry_count": 1, "retry_of": 8}),
    ])
    starts = [c.start.reason for c in linked.chains]
    assert starts == ["first", "side_call", "history_rewritten", "rewound"]
    assert [e.reason for e in linked.excluded] == ["failed", "cancelled", "flagged", "no_tokens",
                                                   "retried", "cancelled"]
    # What the viewer and the report explain (the tables) is what the types allow and what
    # link() gives: no reason without an explanation, no explanation never used.
    assert set(BREAK_REASONS) == set(get_args(BreakReason)) == set(starts)
    assert set(EXCLUDE_REASONS) == set(get_args(ExcludeReason)) == {
        e.reason for e in linked.excluded}
    assert all(BREAK_REASONS.values()) and all(EXCLUDE_REASONS.values())


def test_report_counts_per_rollout_and_per_harness() -> None:
    side = [make_turn(0, P0, C0, rollout="r2"), make_turn(1, (1, 90), (95,), rollout="r2"),
            make_turn(2, (*P0, 10, 99), C1, rollout="r2"),
            make_turn(3, P1, C1, status="failed", rollout="r2")]
    result = build_report([
        (Rollout("r1", 0.0, metadata={"harness": "codex"}), three_turns()),
        (Rollout("r2", 0.0, metadata={"harness": "codex"}), side),
        (Rollout("r3", 0.0), [make_turn(0, P0, C0, rollout="r3")]),
    ])
    r2 = result.to_dict()["rollouts"]["r2"]
    assert r2 == {"harness": "codex", "rollouts": 1, "turns": 4, "trainable": 3, "chains": 3,
                  "extended": 0, "extension_rate": 0.0,
                  "breaks": {"first": 1, "side_call": 1, "history_rewritten": 1},
                  "excluded": {"failed": 1}, "capped": 0}
    codex = result.harnesses["codex"]
    assert (codex.rollouts, codex.turns, codex.trainable, codex.chains) == (2, 7, 6, 4)
    assert codex.extended == 2 and codex.extension_rate == pytest.approx(2 / 3)
    assert result.harnesses["unknown"].extension_rate is None  # nothing continued
    console = Console(width=200, record=True)
    console.print(render_report(result))
    text = console.export_text()
    assert "codex" in text and "67%" in text and "side_call 1" in text and "r3" in text


# ------------------------------------------------------------------ properties
ids = st.lists(st.integers(0, 50), max_size=6)


@st.composite
def built_chain(draw) -> list[Turn]:
    """Turns that extend each other by construction: prompt_{k+1} = prompt_k +
    completion_k + inserted_k."""
    prompt = tuple(draw(st.lists(st.integers(0, 50), min_size=1, max_size=6)))
    turns = []
    for index in range(draw(st.integers(1, 6))):
        completion = tuple(draw(ids))
        turns.append(make_turn(index, prompt, completion))
        prompt = (*prompt, *completion, *draw(ids))
    return turns


@given(built_chain())
def test_built_chains_become_one_exact_sample(turns) -> None:
    [s] = samples_for_rollout(turns)
    last = turns[-1].completion.tokens
    assert s.prompt_ids + s.completion_ids == last.prompt_ids + last.completion_ids
    sampled = [i for i, m in zip(s.completion_ids, s.mask, strict=True) if m]
    every = [t.completion.tokens for t in turns]
    assert sampled == [i for t in every for i in t.completion_ids]
    assert sum(s.mask) == len(s.logprobs) == sum(len(t.completion_ids) for t in every)
    assert s.logprobs == tuple(lp for t in every for lp in t.logprobs)
    dense = s.dense_logprobs()
    assert len(dense) == len(s.completion_ids)
    assert [v for v, m in zip(dense, s.mask, strict=True) if m] == list(s.logprobs)


@given(built_chain(), st.data())
def test_one_changed_token_breaks_exactly_there(turns, data) -> None:
    last = turns[-1].completion.tokens
    history = last.prompt_ids + last.completion_ids
    position = data.draw(st.integers(0, len(history) - 1))
    changed = (*history[:position], history[position] + 1000, *data.draw(ids))
    linked = link([*turns, make_turn(len(turns), changed, (1,))])
    [*_, broken] = linked.chains
    assert broken.start.turn == len(turns) and broken.start.diverged_at == position
    expected = "side_call" if position < 0.5 * len(turns[0].completion.tokens.prompt_ids) \
        else "history_rewritten"
    assert broken.start.reason == expected
    owner = turns[broken.start.within_turn].completion.tokens
    assert position < len(owner.prompt_ids) + len(owner.completion_ids)
    assert (position < len(owner.prompt_ids)) == (broken.start.within == "prompt")


# ------------------------------------------------------------------ through the proxy
def title_or_next(replies):
    """The scripted policy: a title for a request with a system prompt, else the script."""
    script = itertools.cycle(replies)
    return lambda request: (Reply("Hello file") if request.messages[0].role == "system"
                            else Reply(next(script)))


@pytest.fixture
def served(tokenizer, tmp_path: Path):
    engine = ScriptedEngine(tokenizer, title_or_next(REPLIES), model="scripted")
    with ServedProxy(make_proxy(engine, tmp_path / "run")).running() as served:
        yield served


def converse(served, key: str, *, title_after: int | None = None) -> None:
    driver, history = Chat(), Chat().start()
    headers = {"authorization": f"Bearer {key}"}
    for turn in range(len(REPLIES)):
        resp = httpx.post(f"{served.url}{driver.path}", json=driver.body(history),
                          headers=headers, timeout=30)
        assert resp.status_code == 200, resp.text
        history = driver.extend(history, resp.json())
        if turn == title_after:
            title = {"model": "m", "messages": [
                {"role": "system", "content": "Write a title."}, history[0]]}
            resp = httpx.post(f"{served.url}{driver.path}", json=title, headers=headers)
            assert resp.json()["choices"][0]["message"]["content"] == "Hello file"


def test_captured_conversation_is_one_sample_of_the_sampled_ids(served) -> None:
    key = served.new_rollout(metadata={"harness": "chat-driver"})["key"]
    converse(served, key)
    turns = served.store.turns(key)
    [s] = samples_for_rollout(turns)
    every = [t.completion.tokens for t in turns]
    assert s.turns == (0, 1, 2) and s.prompt_ids == every[0].prompt_ids
    sampled = [i for i, m in zip(s.completion_ids, s.mask, strict=True) if m]
    assert sampled == [i for t in every for i in t.completion_ids]
    assert s.logprobs == tuple(lp for t in every for lp in t.logprobs)
    assert s.prompt_ids + s.completion_ids == every[-1].prompt_ids + every[-1].completion_ids
    assert 0 in s.mask  # the tool results and template tokens between turns are inserted
    assert s.weight_versions == ("scripted",) * 3
    assert list(iter_samples(served.store)) == [s]
    stats = report(served.store).harnesses["chat-driver"]
    assert (stats.turns, stats.chains, stats.extended, stats.extension_rate) == (3, 1, 2, 1.0)


def test_captured_title_call_is_a_side_chain(served) -> None:
    key = served.new_rollout(metadata={"harness": "chat-driver"})["key"]
    converse(served, key, title_after=0)
    turns = served.store.turns(key)
    main, title = chains(turns)
    assert [t.index for t in main.turns] == [0, 2, 3]
    assert title.start.reason == "side_call" and title.start.against == 0
    assert title.start.within == "prompt" and title.start.within_turn == 0
    assert report(served.store).rollouts[key] == ("chat-driver", ChainStats(
        rollouts=1, turns=4, trainable=4, chains=2,
        breaks=Counter(first=1, side_call=1)))
