"""GRPO for agent rollouts (issue 45), on a scripted engine and scripted rewards: turns are
built here token for token, rewards are set per rollout, so every figure is known.

- whole groups per step, advantages summing to zero per group, stale groups dropped whole;
- groups with no reward spread queue nothing and more tasks are drawn;
- the optimizer does not step on a batch with no gradient;
- a reply the harness dropped, and a reply cut by max_tokens, get no loss by default;
- the advantage's scale and the control arm's shuffle.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections import Counter
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from harnessrl.rollout.analysis.chains import dropped_replies, link
from harnessrl.train.rows.grpo import (
    RowSettings,
    flagged_turns,
    group_advantages,
    has_spread,
    shuffled,
)
from harnessrl.types import (
    ChatRequest,
    Completion,
    Message,
    Outcome,
    Text,
    Timings,
    Tokens,
    Turn,
    Usage,
)

SYSTEM = tuple(range(1, 41))  # a 40-id system prompt every main turn starts with
EOS = 2


def turn(key: str, index: int, prompt: Sequence[int], completion: Sequence[int],
         finish: str = "stop", version: str | None = "v1") -> Turn:
    request = ChatRequest(model="m", messages=(Message("user", (Text("hi"),)),))
    tokens = Tokens(tuple(prompt), tuple(completion),
                    tuple(-0.5 - 0.01 * i for i in range(len(completion))))
    done = Completion("m", (Text("reply"),), finish,  # type: ignore[arg-type]
                      Usage(len(prompt), len(completion)), tokens)
    return Turn(rollout=key, index=index, dialect="openai_chat", status="ok",
                timings=Timings(1.0, 2.0, 3.0), raw_request=b"{}", request=request,
                completion=done, weight_version=version)


def reply(seed: int, n: int = 20) -> tuple[int, ...]:
    return (*range(1000 + 100 * seed, 1000 + 100 * seed + n - 1), EOS)


def agent_turns(key: str, *, rejected: bool = False, truncated: bool = False,
                side_call: bool = True, version: str = "v1") -> list[Turn]:
    """Four main turns that extend each other (a tool result between them) and a side
    call (its own chain). `rejected`: the second reply is dropped from the history (the
    third prompt repeats the second prompt, then an error message): turns 0-1 and 2-3
    are two chains. `truncated`: the third reply was cut by max_tokens."""
    p0 = (*SYSTEM, 50, 51)
    r0, r1, r2, r3 = reply(1), reply(2), reply(3), reply(4)
    p1 = (*p0, *r0, 60, 61, 62)
    p2 = (*p1, 70, 71) if rejected else (*p1, *r1, 70, 71)
    p3 = (*p2, *r2, 80, 81)
    turns = [turn(key, 0, p0, r0, version=version), turn(key, 1, p1, r1, version=version),
             turn(key, 2, p2, r2, "length" if truncated else "stop", version),
             turn(key, 3, p3, r3, version=version)]
    if side_call:
        turns.append(turn(key, 4, (900, 901, 902), (903, 904, EOS), version=version))
    return turns


def outcome(key: str, reward: float | None, task: str = "t", harness: str = "h",
            timed_out: bool = False) -> Outcome:
    if reward is None:
        return Outcome(harness=harness, harness_version="1", task=task, sample=0,
                       rollout=key, status="infra_error")
    return Outcome(harness=harness, harness_version="1", task=task, sample=0, rollout=key,
                   status="done", reward=reward, verifier_reward=reward, turns=4,
                   agent_timed_out=timed_out)


# ------------------------------------------------------------------ advantages
def test_advantage_scales_and_spread():
    rewards = [1.0, 0.99, 1.0, None]  # an all-pass group split by a shaping term
    group = group_advantages(rewards, "group")
    none = group_advantages(rewards, "none")
    assert sum(group) == pytest.approx(0.0, abs=1e-9) and group[3] == 0.0
    assert max(group) == pytest.approx(2 ** -0.5, rel=1e-4)  # +-1-sized from a 0.01 spread
    assert none == pytest.approx([0.01 / 3, -0.02 / 3, 0.01 / 3, 0.0], abs=1e-12)
    assert group_advantages(rewards, "batch") == none  # centred; the step divides
    assert has_spread(rewards) and not has_spread([1.0, 1.0, None])
    assert not has_spread([0.0, None]) and not has_spread([])


def test_shuffle_control_keeps_each_groups_advantages_and_is_seeded():
    rewards: list[float | None] = [1.0, 0.0, 0.0, 1.0, None, 0.5, 0.2, 0.9]
    adv = group_advantages(rewards)
    seen = set()
    for group in range(20):
        out = shuffled(adv, rewards, seed=3, group=group)
        assert sorted(out) == pytest.approx(sorted(adv))  # the same multiset
        assert out[4] == 0.0  # an infrastructure failure keeps its 0
        assert out == shuffled(adv, rewards, seed=3, group=group)  # deterministic
        seen.add(tuple(out))
    assert len(seen) > 1  # the permutation differs from group to group
    assert [shuffled(adv, rewards, 4, g) for g in range(5)] != [
        shuffled(adv, rewards, 3, g) for g in range(5)]  # and from seed to seed


# ------------------------------------------------------------------ flagged replies
def test_a_dropped_reply_is_found_and_a_rerendered_one_is_not():
    dropped = agent_turns("r", rejected=True, side_call=False)
    assert dropped_replies(link(dropped)) == {1}
    kept = agent_turns("r", side_call=False)
    assert dropped_replies(link(kept)) == set()
    # history re-rendered: the reply's first ids (its reasoning) removed, its end kept
    p0, r0 = (*SYSTEM, 50), reply(1)
    rerendered = [turn("r", 0, p0, r0), turn("r", 1, (*p0, *r0[3:], 60), reply(2))]
    assert len(link(rerendered).chains) == 2  # the chain breaks inside the reply ...
    assert dropped_replies(link(rerendered)) == set()  # ... which was not dropped
    # the rollout's last reply, which no later prompt could hold, is not dropped
    assert 3 not in dropped_replies(link(dropped))


def test_a_reply_dropped_where_another_message_takes_its_place_is_found():
    """Every real prompt ends with the template's assistant header; a harness that drops a
    reply and goes on with its error message (mini-swe-agent's "No tool calls found")
    diverges inside that header, where the next role's header is, not inside the reply."""
    assistant, user = (7, 8), (9, 8)
    p0 = (*SYSTEM, 50, *assistant)
    r0, r1, r2 = reply(1), reply(2), reply(3)
    p1 = (*p0, *r0, 60, 61, *assistant)
    dropped = (*p1[:-2], *user, 70, 71, *assistant)  # r1 gone, the error message instead
    assert dropped_replies(link([turn("r", 0, p0, r0), turn("r", 1, p1, r1),
                                 turn("r", 2, dropped, r2)])) == {1}
    # kept: the next prompt goes on from the reply, one chain and nothing dropped
    kept = (*p1, *r1, *user, 70, 71, *assistant)
    assert dropped_replies(link([turn("r", 0, p0, r0), turn("r", 1, p1, r1),
                                 turn("r", 2, kept, r2)])) == set()
    # a side call on the same history, then the main chain goes on from the reply: the
    # side call left the reply out, the harness did not
    side = (*p1[:-2], *user, 99, *assistant)
    assert dropped_replies(link([turn("r", 0, p0, r0), turn("r", 1, p1, r1),
                                 turn("r", 2, side, reply(5)), turn("r", 3, kept, r2)])) == set()


def _mask_by_turn(turns: list[Turn], settings: RowSettings) -> list[tuple[Any, ...]]:
    from harnessrl.train.async_grpo.groups import score_group

    report, rows = score_group(0, "t", [(outcome("r", 1.0), turns),
                                        (outcome("s", 0.0), agent_turns("s"))], settings)
    return [(row, s, adv) for row, (s, adv, _) in zip(report.rows, rows, strict=True)
            if row.rollout == "r"]


def test_rejected_and_truncated_replies_get_no_loss_by_default_row_by_row():
    from harnessrl.rollout.analysis.chains import chains
    from harnessrl.train.rows.samples import turn_spans

    turns = agent_turns("r", rejected=True, truncated=True)
    assert flagged_turns(turns) == {1: "rejected", 2: "truncated"}
    rows = _mask_by_turn(turns, RowSettings())
    main = {c.turns[0].index: turn_spans(c) for c in chains(turns)}
    checked = 0
    for row, s, adv in rows:
        spans = main[s.turns[0]]
        assert row.kind == "rollout" and adv == pytest.approx(1.0, abs=1e-6)
        for index, (start, end) in spans.items():
            want = 0 if index in (1, 2) else 1
            assert set(s.mask[start:end]) == {want}, (index, row.turns)
            checked += 1
        assert len(s.logprobs) == sum(s.mask)  # the engine's logprobs of trained ids only
        assert dict(row.flagged) == {i: f for i, f in ((1, "rejected"), (2, "truncated"))
                                     if i in s.turns}
        assert row.treatment == ("mask" if row.flagged else "train")
    assert checked == 5  # every turn, in its row (chains 0-1, 2-3 and the side call)


def test_penalty_gives_the_flagged_replies_a_row_of_their_own():
    turns = agent_turns("r", rejected=True, truncated=True)
    rows = _mask_by_turn(turns, RowSettings(rejected_turns="penalty",
                                            truncated_turns="train", format_penalty=0.5))
    penalty = [(row, s, adv) for row, s, adv in rows if row.kind == "penalty"]
    [(row, s, adv)] = penalty
    assert adv == -0.5 and row.flagged == ((1, "rejected"),)
    # its loss mask holds the rejected reply only; the chain's own row keeps the
    # truncated reply (train) and not the rejected one
    [(own_row, own, _)] = [(r, s, a) for r, s, a in rows if r.kind == "rollout" and 1 in s.turns]
    assert sum(s.mask) == 20 and sum(own.mask) == 20 and own_row.treatment == "penalty"
    assert all(not (a and b) for a, b in zip(s.mask, own.mask, strict=True))


def test_the_control_shuffles_the_rollouts_advantages_and_keeps_the_penalty_rows():
    """Issue 46's control on its recipe (cut replies penalised): only the rollouts'
    advantages are permuted within the group; a penalty row keeps -format_penalty, so the
    control learns "do not run past max_tokens" as rl-one does, and the two differ only in
    whether the task reward steers the rest."""
    from harnessrl.train.async_grpo.groups import score_group

    finished = [(outcome(f"r{i}", float(i % 2)), agent_turns(f"r{i}", truncated=i < 2))
                for i in range(6)]
    rows_of = {}
    for control in ("none", "shuffle"):  # seed 1: a permutation that moves this group's
        # advantages (with 3 passes of 6, 1 in 20 permutations leaves them where they were)
        settings = RowSettings(truncated_turns="penalty", advantage_control=control, seed=1)
        report, rows = score_group(3, "t", finished, settings)
        rows_of[control] = (report, [(r, adv) for r, (_, adv, _) in
                                     zip(report.rows, rows, strict=True)])
    (plain, plain_rows), (control, control_rows) = rows_of["none"], rows_of["shuffle"]
    assert sorted(control.advantages) == pytest.approx(sorted(plain.advantages))
    assert list(control.advantages) != pytest.approx(list(plain.advantages))
    for report, rows in ((plain, plain_rows), (control, control_rows)):
        penalty = [adv for row, adv in rows if row.kind == "penalty"]
        assert penalty == [-1.0, -1.0]  # r0's and r1's cut replies, whatever the shuffle
        by_rollout = dict(zip((o.rollout for o in report.outcomes), report.advantages,
                              strict=True))
        assert all(adv == by_rollout[row.rollout] for row, adv in rows if row.kind == "rollout")


def test_train_keeps_every_reply():
    turns = agent_turns("r", rejected=True, truncated=True)
    rows = _mask_by_turn(turns, RowSettings(rejected_turns="train", truncated_turns="train"))
    assert sum(sum(s.mask) for _, s, _ in rows) == 4 * 20 + 3


def test_the_sync_trainers_row_masks_the_same_replies():
    from harnessrl.train.trl import record_for

    turns = agent_turns("r", truncated=True, side_call=False)  # one chain: 0-3
    masked = record_for(outcome("r", 1.0), turns, RowSettings())
    kept = record_for(outcome("r", 1.0), turns)  # no settings: every reply trained
    assert masked.sample is not None and kept.sample is not None
    assert sum(kept.sample.mask) == 80 and sum(masked.sample.mask) == 60
    dropped = [i for i, (a, b) in enumerate(zip(kept.sample.mask, masked.sample.mask,
                                                strict=True)) if a != b]
    assert [kept.sample.completion_ids[i] for i in dropped] == list(reply(3))


@pytest.mark.parametrize(("grpo", "says"), [
    ({"rejected_turns": "penalty"}, "rejected_turns"),
    ({"truncated_turns": "penalty"}, "truncated_turns"),
    ({"advantage_control": "shuffle"}, "advantage_control")])
def test_the_sync_trainer_refuses_what_only_the_async_one_does(grpo, says):
    from harnessrl.train.config import GRPOSettings, TrainSettings
    from harnessrl.train.loop import check_sync

    config = TrainSettings(grpo=GRPOSettings(trainer="sync", **grpo))
    with pytest.raises(ValueError, match=says):
        check_sync(config)
    check_sync(TrainSettings(grpo=GRPOSettings(trainer="sync")))  # the defaults run


def test_the_row_and_importance_defaults_are_the_configs() -> None:
    """`RowSettings` and `Importance` repeat `[grpo]`'s defaults for the pure functions
    that take no config; a default changed in one place only fails here."""
    from harnessrl.train.async_grpo.loop import importance_of
    from harnessrl.train.common import row_settings
    from harnessrl.train.config import GRPOSettings, TrainSettings
    from harnessrl.train.rows.grpo import RowSettings
    from harnessrl.train.rows.importance import Importance

    config = TrainSettings(grpo=GRPOSettings(importance="on"))
    assert row_settings(config) == RowSettings()
    assert importance_of(config) == Importance()


@pytest.mark.parametrize("trl", [{"num_iterations": 2}, {"steps_per_generation": 2}])
def test_the_sync_trainer_refuses_a_checkpoint_inside_a_generation(trl):
    """TRL's checkpoint does not hold its buffered rows: a generation spanning optimizer
    steps is refused with checkpoints or a resume, and runs without them."""
    from harnessrl.train.config import CheckpointSettings, GRPOSettings, TrainSettings
    from harnessrl.train.loop import check_sync

    grpo = GRPOSettings(trainer="sync", trl=trl)
    with pytest.raises(ValueError, match="cannot be checkpointed"):
        check_sync(TrainSettings(grpo=grpo, checkpoint=CheckpointSettings(every_steps=2)))
    with pytest.raises(ValueError, match="cannot be checkpointed"):
        check_sync(TrainSettings(grpo=grpo), resume="latest")
    check_sync(TrainSettings(grpo=grpo))
    check_sync(TrainSettings(grpo=GRPOSettings(trainer="sync", trl={
        "gradient_accumulation_steps": 2, "steps_per_generation": 2})), resume="latest")


# ------------------------------------------------------------------ the worker, scripted
class ScriptedRollouts:
    """`HarnessRollouts`' face to the worker, with a scripted engine (the turns of
    `agent_turns`) and scripted rewards: task `solved` always passes (no spread), task
    `mixed` alternates pass and fail by sample number."""

    def __init__(self, version: str = "v1") -> None:
        self.tasks = [SimpleNamespace(id="solved", instruction="s"),
                      SimpleNamespace(id="mixed", instruction="m")]
        self.harnesses = [SimpleNamespace(name="h")]
        self.rotation = 0
        self.version = version
        self.turns: dict[str, list[Turn]] = {}
        self.count = Counter[str]()
        self.train_retried = False  # grpo.train_retried

    def __enter__(self) -> ScriptedRollouts:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def plan(self, task_ids: list[str], generations: int) -> list[str]:
        return list(task_ids)

    async def run_planned(self, planned: list[str]) -> list[Outcome]:
        [task] = planned
        await asyncio.sleep(0.001)
        n = self.count[task]
        self.count[task] += 1
        key = f"{task}-{n}"
        self.turns[key] = agent_turns(key, rejected=n % 3 == 0, version=self.version)
        return [outcome(key, 1.0 if task == "solved" or n % 2 else 0.0, task)]

    def seen_turns(self, key: str) -> list[Turn]:
        return self.turns[key]


@pytest.fixture
def sample_stand_in(monkeypatch):
    """TRL's `RolloutSample` is a plain record of the fields the worker sets; importing
    it imports vLLM (20-50 s here), so the worker tests take a stand-in of the same name."""
    import harnessrl.train.trl_compat as trl_compat

    monkeypatch.setattr(trl_compat, "async_trl",
                        lambda: SimpleNamespace(rollout_sample=SimpleNamespace))


def _worker(groups: int, **kw: Any) -> tuple[Any, list[Any]]:
    from harnessrl.train.async_grpo.worker import HarnessRolloutWorker

    worker = HarnessRolloutWorker(ScriptedRollouts(), num_generations=4,  # type: ignore[arg-type]
                                  max_inflight=4, max_staleness=1, **kw)
    worker.update_model_version(1)
    worker.start()
    items = []
    try:
        deadline = time.time() + 60
        while len(items) < groups and time.time() < deadline:
            items.append(worker.rollout_buffer.get(timeout=30))
    finally:
        worker.stop()
    return worker, items


def test_uniform_groups_queue_nothing_and_more_tasks_fill_the_step(sample_stand_in):
    worker, items = _worker(3)
    assert len(items) == 3
    # `solved` groups (every rollout passes) were played and dropped; only `mixed` queued
    assert worker.stats["groups_uniform"] >= 2 and worker.stats["rows_uniform"] > 0
    uniform = [r for r in worker.reports if not r.spread]
    assert uniform and all(row.fate == "uniform" for r in uniform for row in r.rows)
    for item in items:
        rollouts = {int(s.group_id) for s in item.samples}
        assert rollouts == {item.group}
        report = next(r for r in worker.reports if r.group == item.group)
        assert report.task == "mixed" and report.spread
        # every row of every rollout of the group is in the item, and only those
        assert len(item.samples) == len(report.rows) > 4
        assert sorted(tuple(s.input_ids.tolist()) for s in item.samples) == sorted(
            r.input_ids for r in report.rows)
        assert sum(report.advantages) == pytest.approx(0.0, abs=1e-6)
        assert item.rewards == [o.reward for o in report.outcomes]


def test_without_the_filter_uniform_groups_are_queued_with_no_advantage(sample_stand_in):
    _, items = _worker(2, drop_uniform=False)
    solved = [i for i in items if i.rewards == [1.0] * 4]
    assert solved and all(s.advantage == 0.0 for i in solved for s in i.samples)


# ------------------------------------------------------------------ the step's batches
class PackedRowStandIn:
    """Stands in for TRL's `TreeRow` (its samples and a load), which importing would
    import vLLM; the partition logic under test is ours."""

    def __init__(self) -> None:
        self.samples: list[dict[str, Any]] = []
        self.load = 0

    def add(self, sample: dict[str, Any]) -> None:
        self.samples.append(sample)
        self.load += len(sample["input_ids"])


def _item(group: int, version: int, rewards: list[float], rows_per_rollout: int = 3) -> Any:
    from harnessrl.train.async_grpo.batches import GroupItem

    adv = group_advantages(rewards, "none")
    samples = [SimpleNamespace(input_ids=np.arange(5 + r), completion_mask=np.ones(5 + r),
                               old_log_probs=np.zeros(5 + r), advantage=a, group_id=group,
                               metrics={}, rollout=i)
               for i, a in enumerate(adv) for r in range(rows_per_rollout)]
    return GroupItem(group, version, samples, rewards)


def _batches(items: list[Any], version: int, steps: int, *, scale: str = "none",
             processes: int = 1, max_staleness: int = 1) -> tuple[list[Any], dict]:
    from collections import defaultdict

    from harnessrl.train.async_grpo.batches import GroupBatcher, GroupQueue

    source: queue.Queue = queue.Queue()
    for item in items:
        source.put(item)
    sink: dict = defaultdict(list)

    def healthy(_: float) -> None:
        raise TimeoutError("no more groups")

    groups = GroupQueue(source, lambda: version, healthy, 1.0, sink, max_staleness,
                        poll_s=0.01)
    batcher = GroupBatcher(groups, processes, 2, scale, sink,  # type: ignore[arg-type]
                           PackedRowStandIn)
    out = []
    it = iter(batcher)
    for _ in range(steps):
        out.append(next(it))
    return out, sink


def test_every_step_is_whole_groups_and_a_stale_group_goes_whole():
    items = [_item(0, 5, [1.0, 0.0, 0.0, 1.0]), _item(1, 2, [1.0, 0.0, 1.0, 1.0]),
             _item(2, 4, [0.3, 0.1, 0.2, 0.9]), _item(3, 5, [1.0, 0.0, 0.0, 0.0]),
             _item(4, 5, [0.0, 0.5, 0.0, 0.0])]
    steps, sink = _batches(items, version=5, steps=2, processes=2)
    seen = []
    for rows in steps:
        samples = [s for row in rows for s in row.samples]
        groups = Counter(s["group_id"] for s in samples)
        assert len(groups) == 2 and all(n == 12 for n in groups.values())  # whole
        for g in groups:  # a rollout's rows share its advantage: zero-sum per group
            assert sum(s["advantage"] for s in samples if s["group_id"] == g) == \
                pytest.approx(0.0, abs=1e-9)
        assert all(row.samples for row in rows)  # both processes forward something
        seen += list(groups)
    assert seen == [0, 2, 3, 4]  # group 1 (3 versions behind) was dropped whole
    assert sink["sample/dropped_stale_total"] == [12.0]
    assert sink["harnessrl/groups_stale_dropped_total"] == [1.0]


def test_batch_scale_divides_by_the_std_of_the_steps_rewards():
    items = [_item(0, 1, [1.0, 0.0, 0.0, 0.0]), _item(1, 1, [1.0, 1.0, 0.0, 1.0])]
    [rows], _ = _batches(items, version=1, steps=1, scale="batch")
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    std = float(np.std(rewards))
    got = sorted({round(s["advantage"], 9) for row in rows for s in row.samples})
    want = sorted({round(a / (std + 1e-8), 9) for r in ([1.0, 0, 0, 0], [1.0, 1, 0, 1])
                   for a in group_advantages(r, "none")})
    assert got == pytest.approx(want)


# ------------------------------------------------------------------ the optimizer's guard
def test_a_skipped_step_is_logged_under_one_name_by_both_trainers(tmp_path) -> None:
    """The sync trainer's guard logs what the async one's does (`NO_GRADIENT`), and its
    metrics.jsonl line says the step had no gradient."""
    import io

    from rich.console import Console

    from harnessrl.train.common import NO_GRADIENT
    from harnessrl.train.loop import StepLog

    log = StepLog(tmp_path / "metrics.jsonl", SimpleNamespace(batches=[], sync=None),
                  Console(file=io.StringIO()))
    log.add(1, {"loss": 0.0, NO_GRADIENT: 1.0})
    log.add(2, {"loss": 0.5})
    assert [line["no_gradient"] for line in log.steps] == [1, 0]
    assert NO_GRADIENT == "harnessrl/steps_without_gradient_total"  # the async trainer's


def test_the_optimizer_does_not_step_on_a_batch_with_no_gradient():
    import torch

    from harnessrl.train.common import guard_optimizer, has_gradient

    def run(guarded: bool) -> tuple[torch.Tensor, torch.Tensor, int]:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1)
        advantages = [torch.ones(8), torch.zeros(8)]  # a real step, then none
        live = iter([a.ne(0).sum().item() > 0 for a in advantages])
        skipped = []
        if guarded:
            for _ in range(2):  # guarded once, however often the trainer asks
                guard_optimizer(opt, lambda: next(live), lambda: skipped.append(1))
        x = torch.randn(8, 4)
        weights = []
        for adv in advantages:
            loss = -(model(x).squeeze(-1) * adv).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            weights.append(model.weight.detach().clone())
        return weights[0], weights[1], len(skipped)

    model = torch.nn.Linear(2, 1)
    assert not has_gradient(model)
    (model(torch.ones(1, 2)).sum() * 0).backward()
    assert not has_gradient(model)  # zero everywhere
    model(torch.ones(1, 2)).sum().backward()
    assert has_gradient(model)

    first, last, skipped = run(guarded=True)
    assert torch.equal(first, last) and skipped == 1
    first, last, _ = run(guarded=False)
    assert not torch.equal(first, last)  # AdamW's moments move the weights unguarded


# ------------------------------------------------------------------ the real trainer
class ScriptedGroupWorker:
    """TRL's `RolloutWorkerProtocol`, scripted: queues fixed whole groups at start (the
    first two with no advantage at all), as the harnessrl worker queues them."""

    def __init__(self, groups: list[list[float]], engine_logprob: float = -3.0) -> None:
        self.rollout_buffer: queue.Queue[Any] = queue.Queue()
        self.metrics_queue: queue.Queue[Any] = queue.Queue()
        self.groups = groups
        self.engine_logprob = engine_logprob

    def start(self) -> None:
        from harnessrl.train.async_grpo.batches import GroupItem
        from harnessrl.train.trl_compat import async_trl

        sample = async_trl().rollout_sample
        for g, advantages in enumerate(self.groups):
            rows = []
            for i, adv in enumerate(advantages):
                for chain in range(1 + i % 2):  # a rollout is one or two rows
                    ids = np.asarray([1 + (g * 7 + i * 3 + chain + k) % 50 for k in range(10)])
                    rows.append(sample(
                        prompt=[], completion=[], input_ids=ids,
                        completion_mask=np.asarray([0] * 4 + [1] * 6),
                        old_log_probs=np.full(10, self.engine_logprob, dtype=np.float32),
                        advantage=adv,
                        model_version=0, group_id=g, metrics={}))
            self.rollout_buffer.put(GroupItem(g, 0, rows, [0.0] * len(advantages)))

    def stop(self) -> None:
        pass

    def update_model_version(self, model_version: int) -> None:
        pass

    def check_health(self, stale_after_s: float) -> None:
        pass


class NoTransfer:
    """A weight transfer that sends nothing (no vLLM in this test)."""

    def init_weight_transfer(self) -> None: ...
    def pause(self) -> None: ...
    def send_weights(self, iterator: Any) -> None: ...
    def resume(self) -> None: ...
    def destroy(self) -> None: ...


# importance sampling: none; a band wide enough to mask nothing; the default band with the
# engine's logprobs perturbed so far (+5: rho < e^-5) that every token leaves it
CORRECTIONS = [(None, -3.0), ("wide", -3.0), ("default", 5.0)]


@pytest.mark.slow  # imports TRL's async trainer, which imports vLLM (~20-50 s)
@pytest.mark.parametrize(("importance", "engine_logprob"), CORRECTIONS)
def test_the_trainer_takes_whole_groups_and_does_not_step_without_a_gradient(
        tiny_model, tmp_path, importance, engine_logprob):
    import torch
    from datasets import Dataset

    from harnessrl.train.async_grpo.batches import group_trainer
    from harnessrl.train.async_grpo.transfer import install_cpu_support
    from harnessrl.train.rows.importance import Importance
    from harnessrl.train.trl_compat import async_trl

    trl = async_trl()
    install_cpu_support()
    args = trl.config(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4,
        num_generations=2, learning_rate=5e-2, weight_decay=0.1, use_cpu=True, bf16=False,
        dtype="float32", report_to="none", logging_steps=1, save_strategy="no",
        token_budget=0, max_staleness=4, vllm_server_base_url="http://127.0.0.1:9",
        seed=0, disable_tqdm=True)
    # step 1: two groups, every advantage 0; step 2: two groups with a spread; two more
    # that accelerate's dispatcher fetches ahead of the last step and nobody trains
    worker = ScriptedGroupWorker([[0.0, 0.0], [0.0, 0.0], [1.0, -1.0], [-1.0, 1.0],
                                  [1.0, -1.0], [1.0, -1.0]], engine_logprob)
    correction = {None: None, "wide": Importance(cap=2.0, band=(1e-30, 1e30)),
                  "default": Importance()}[importance]
    trainer = group_trainer(trl.trainer, groups_per_step=2, scale="group",
                            importance=correction)(
        model=str(tiny_model), args=args, rollout_worker=worker, weight_transfer=NoTransfer(),
        train_dataset=Dataset.from_dict({"prompt": ["t"]}))
    seen: list[dict[str, torch.Tensor]] = []

    def params() -> dict[str, torch.Tensor]:
        model = trainer.accelerator.unwrap_model(trainer.model)
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    from transformers import TrainerCallback

    class Snapshot(TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            seen.append(params())

    trainer.add_callback(Snapshot())
    before = params()
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert trainer.state.global_step == 2 and len(seen) == 2
    # step 1 had no gradient: no optimizer step, so weight decay moved nothing either
    assert all(torch.equal(before[n], seen[0][n]) for n in before)
    assert logs[0].get("harnessrl/steps_without_gradient_total") == 1
    moved = any(not torch.equal(seen[0][n], seen[1][n]) for n in before)
    if importance == "default":  # every token masked: no gradient, no step
        assert logs[1].get("harnessrl/is_masked_fraction") == 1.0
        assert not moved and logs[1].get("harnessrl/steps_without_gradient_total") == 1
    else:  # step 2 had a gradient
        assert moved and not logs[1].get("harnessrl/steps_without_gradient_total")
    if importance == "wide":
        assert logs[1].get("harnessrl/is_masked_fraction") == 0.0
        assert logs[1].get("harnessrl/kl_to_sampler") > 0  # a random model is not -3.0
    if importance is None:
        assert "harnessrl/is_masked_fraction" not in logs[1]
    # each step took two whole groups: all 3 rows of each
    # (TRL's batch/groups_per_step counts the batch accelerate fetched ahead as well)
    assert [e.get("harnessrl/step_groups") for e in logs] == [2, 2]
    assert [e.get("harnessrl/step_rows") for e in logs] == [6, 6]


# ------------------------------------------------------------------ importance sampling
def _ppo(log_probs: Any, old: Any, adv: Any, eps: float = 0.2) -> Any:
    """TRL's async per-token loss, as its compute_loss takes it."""
    import torch

    ratio = torch.exp(log_probs - old)
    return -torch.min(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv)


def test_importance_sampling_follows_perturbed_engine_logprobs():
    import math

    import torch

    from harnessrl.train.rows.importance import STATS, Importance, correct, measure, metrics

    settings = Importance(cap=2.0, band=(0.125, 8.0))
    trainer = torch.log(torch.tensor([0.5, 0.4, 0.3, 0.2, 0.1, 0.25]))
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0, -1.0, 0.0])

    # equal logprobs: nothing masked or capped, ratio 1, KL 0, the loss untouched
    lp = trainer.clone().requires_grad_(True)
    fixed, masked = correct(lp, trainer, adv, settings)
    sums = dict(zip(STATS, measure(lp, trainer, adv, masked, settings).tolist(), strict=True))
    assert not masked.any() and torch.equal(fixed, lp)
    assert sums["masked"] == 0 and sums["capped"] == 0 and sums["live"] == 5
    assert sums["ratio_sum"] == pytest.approx(6.0) and sums["kl_sum"] == pytest.approx(0.0)

    # the engine's logprobs perturbed on purpose: rho = trainer / engine per token
    rho = torch.tensor([1.0, 3.0, 10.0, 0.05, 1.5, 20.0])
    engine = trainer - torch.log(rho)
    lp = trainer.clone().requires_grad_(True)
    fixed, masked = correct(lp, engine, adv, settings)
    sums = dict(zip(STATS, measure(lp, engine, adv, masked, settings).tolist(), strict=True))
    assert masked.tolist() == [False, False, True, True, False, True]  # outside [1/8, 8]
    assert sums["masked"] == 3 and sums["capped"] == 1  # token 1: rho 3 > 2, advantage < 0
    assert sums["live"] == 3  # tokens 0, 1, 4 (5 has advantage 0 and is masked anyway)
    assert sums["ratio_sum"] == pytest.approx(float(rho.sum()), rel=1e-5)
    want_kl = sum((r - 1) - math.log(r) for r in rho.tolist())
    assert sums["kl_sum"] == pytest.approx(want_kl, rel=1e-5)
    rates = metrics(sums, float(rho.max()))
    assert rates["harnessrl/is_masked_fraction"] == (3.0, 6.0)
    _ppo(fixed, engine, adv).sum().backward()
    assert lp.grad is not None and plain_grad_checked(engine, adv, trainer)
    grad = lp.grad.tolist()
    assert grad[2] == grad[3] == grad[5] == 0.0  # masked: no gradient
    assert grad[1] == pytest.approx(2.0)  # capped: weight C, not rho = 3
    assert grad[4] == pytest.approx(1.5)  # within the band, under the cap: rho itself
    assert grad[0] == pytest.approx(-1.0)  # rho 1, advantage 1


def plain_grad_checked(engine: Any, adv: Any, trainer: Any) -> bool:
    """Without the correction the capped token's weight is rho, the masked ones move."""
    plain = trainer.clone().requires_grad_(True)
    _ppo(plain, engine, adv).sum().backward()
    assert plain.grad is not None
    assert plain.grad[1] == pytest.approx(3.0) and plain.grad[2] == pytest.approx(10.0)
    return True


def test_importance_is_on_by_default_only_where_the_sides_are_not_both_float32():
    from harnessrl.proxy.engines.build import EngineSettings
    from harnessrl.train.async_grpo.loop import importance_of
    from harnessrl.train.config import GRPOSettings, TrainSettings

    cpu = TrainSettings(engine=EngineSettings(dtype="float32"))
    gpu = TrainSettings(engine=EngineSettings(dtype="bfloat16"))
    assert importance_of(cpu) is None
    on = importance_of(gpu)
    assert on is not None and on.cap == 2.0
    mixed = TrainSettings(engine=EngineSettings(dtype="bfloat16"),
                        grpo=GRPOSettings(trl={"dtype": "float32"}))
    assert importance_of(mixed) is not None
    assert importance_of(TrainSettings(engine=EngineSettings(dtype="float32"),
                                     grpo=GRPOSettings(importance="on"))) is not None
    assert importance_of(TrainSettings(engine=EngineSettings(dtype="bfloat16"),
                                     grpo=GRPOSettings(importance="off"))) is None


def test_a_long_run_of_uniform_groups_is_reported(capsys):
    from harnessrl.train.async_grpo.worker import UNIFORM_WARN, HarnessRolloutWorker

    worker = HarnessRolloutWorker(None, num_generations=2, max_inflight=1,  # type: ignore[arg-type]
                                  max_staleness=0)
    for _ in range(UNIFORM_WARN - 1):
        worker._warn_if_no_signal("uniform")
    worker._warn_if_no_signal("queued")  # a group with a spread ends the run
    assert capsys.readouterr().err == ""
    for _ in range(UNIFORM_WARN):
        worker._warn_if_no_signal("uniform")
    assert f"the last {UNIFORM_WARN} groups" in capsys.readouterr().err


@pytest.mark.parametrize(("trl", "says"), [({"gradient_accumulation_steps": 2}, "tasks_per_step"),
                                           ({"token_budget": 4096}, "whole groups")])
def test_trl_settings_that_would_split_a_steps_groups_are_refused(trl, says):
    from harnessrl.train.async_grpo.loop import check_whole_groups

    with pytest.raises(ValueError, match=says):
        check_whole_groups(trl)
    check_whole_groups({"gradient_accumulation_steps": 1, "token_budget": 0, "epsilon": 0.2})
