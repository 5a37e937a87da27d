"""Asynchronous GRPO: a rollout worker for TRL 1.16's `AsyncGRPOTrainer`.

`HarnessRolloutWorker` implements TRL's `RolloutWorkerProtocol` in this process: real
harnesses run on tasks through the capture proxy, `max_inflight` at a time and without
pause, while the trainer takes its steps. Rollouts are planned in GRPO groups of
`num_generations`, one harness per group, rotating (`mix="generation"` alternates the
harnesses within a group instead; `train.trl.HarnessRollouts` plans both). When a group's
last rollout ends, the group is scored and pushed to TRL's rollout queue:

- **Every chain of every rollout** with a sampled token becomes a row (`RolloutSample`),
  not only the main chain: a harness that rewrites its history (compaction, dropped
  replies) starts a new chain at each rewrite, and those tokens are trained too. A row is
  the chain as the engine saw and produced it (`train.rows.samples.sample`), never
  re-tokenized: mask 1 on sampled tokens with the engine's logprobs, 0 elsewhere.
- **The group's advantage** (`train.rows.grpo`): (r - mean) / (std + 1e-8) over the group's
  scored rollouts by default (`grpo.scale_rewards`), shared by all rows of a rollout;
  permuted within the group for a control arm (`grpo.advantage_control`). An
  infrastructure failure has no reward: it is left out of the mean and the std and gives
  no row. Replies the harness dropped from its history, and replies cut by max_tokens,
  are masked out of their row by default (`grpo.rejected_turns`, `truncated_turns`).
- **Whole groups.** A group is queued as one `GroupItem` (every row of every rollout),
  and the trainer takes `tasks_per_step` of them per step (`train.async_grpo.batches`). A
  group whose rewards are all equal is not queued (`grpo.drop_uniform_groups`), so the
  worker's next groups fill the step.
- **Weight versions.** Each row carries the oldest version that sampled one of its turns
  (see `async_weights`). A group whose oldest row is already older than `max_staleness`
  when it ends is dropped here whole and counted (`harnessrl/groups_stale_total`); the
  trainer drops the ones that go stale in its queue, whole, and counts them
  (`harnessrl/groups_stale_dropped_total`, rows in `sample/dropped_stale_total`). None
  is trained silently.

Per group the worker pushes metrics into TRL's metric queue, so they reach the trainer's
own logging (`report_to`) beside TRL's: rows per rollout, sampled tokens trained / sampled
tokens captured with all chains and with the main chain only (per harness), staleness at
enqueue, infrastructure failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harnessrl.rollout.analysis.chains import link
from harnessrl.train.async_grpo.batches import GroupItem
from harnessrl.train.async_grpo.transfer import VersionedTransfer, version_number
from harnessrl.train.rows.grpo import (
    ChainRow,
    RowSettings,
    chain_rows,
    flagged_turns,
    group_advantages,
    has_spread,
    shuffled,
)
from harnessrl.train.rows.samples import kinded_chains, samples_for_rollout
from harnessrl.train.rows.samples import sample as chain_sample
from harnessrl.train.runs.order import TaskOrder
from harnessrl.train.trl import HarnessRollouts, main_chain
from harnessrl.types import CallKind, Outcome, Sample, Turn

if TYPE_CHECKING:
    from multiprocessing.queues import Queue as MPQueue

    from harnessrl.train.async_grpo.schedule import Schedule

POLL_SECONDS = 0.2
UNIFORM_WARN = 20  # uniform groups in a row between two warnings
REPORTS_KEPT = 2000


# ------------------------------------------------------------------ scoring (no I/O)
@dataclass(frozen=True)
class Row:
    """One trained sequence of a rollout, and what became of it."""

    rollout: str
    turns: tuple[int, ...]
    input_ids: tuple[int, ...]
    trained_tokens: int
    version: int | None  # None: a turn has no version we set; the row is not trained
    # queued | stale | untagged | uniform (its group had no reward spread)
    fate: str = "queued"
    advantage: float = 0.0
    # replies of the row left out of its loss or penalised: (turn, rejected | truncated)
    flagged: tuple[tuple[int, str], ...] = ()
    kind: str = "rollout"  # rollout | penalty (the row of penalised replies only)
    treatment: str = "train"  # what was done to its flagged replies: mask | penalty | train


@dataclass(frozen=True)
class GroupReport:
    group: int
    harnesses: tuple[str, ...]
    task: str
    outcomes: tuple[Outcome, ...]
    advantages: tuple[float, ...]
    rows: tuple[Row, ...]
    captured_tokens: dict[str, int]  # per rollout key: sampled tokens of its ok turns
    main_chain_tokens: dict[str, int]
    spread: bool = True  # the scored rewards differ
    flagged: dict[str, dict[int, str]] = field(default_factory=dict)  # per rollout


def advantages(rewards: Sequence[float | None]) -> list[float]:
    """TRL's group advantage over the scored rollouts (population std); 0 for None."""
    return group_advantages(rewards, "group")


def rows_of(turns: Sequence[Turn], kinds: Collection[CallKind] | None = None,
            harness: str | None = None, *, keep_retried: bool = False) -> list[Sample]:
    """Every chain of the rollout that holds a sampled token and is of one of `kinds`
    (None: every kind; `grpo.call_kinds`), as a sample that says its kind;
    `keep_retried`: `grpo.train_retried`."""
    if not turns:
        return []
    return [s for s in samples_for_rollout(turns, kinds, harness, keep_retried=keep_retried)
            if any(s.mask)]


def captured_tokens(turns: Sequence[Turn]) -> int:
    """Sampled tokens the rollout's finished calls returned (cancelled and failed calls
    are no part of its trajectory)."""
    return sum(len(t.completion.tokens.completion_ids or ()) for t in turns
               if t.status == "ok" and t.completion is not None)


def main_chain_tokens(turns: Sequence[Turn], *, keep_retried: bool = False) -> int:
    chain = main_chain(link(turns, keep_retried=keep_retried).chains) if turns else None
    return 0 if chain is None else sum(chain_sample(chain).mask)


def score_group(group: int, task: str, finished: Sequence[tuple[Outcome, list[Turn]]],
                settings: RowSettings | None = None,
                kinds: Collection[CallKind] | None = None, *, keep_retried: bool = False
                ) -> tuple[GroupReport, list[tuple[Sample, float, Outcome]]]:
    """The group's rows, each with its advantage (its rollout's, or a penalty row's),
    and its report (one `Row` per row, in the same order). `kinds`: the call kinds whose
    chains become rows (`grpo.call_kinds`; None: all); `keep_retried`:
    `grpo.train_retried`."""
    settings = settings or RowSettings()
    rewards = [o.reward if o.status == "done" else None for o, _ in finished]
    adv = group_advantages(rewards, settings.scale_rewards)
    if settings.advantage_control == "shuffle":
        adv = shuffled(adv, rewards, settings.seed, group)
    rows: list[tuple[Sample, float, Outcome]] = []
    reports: list[Row] = []
    flagged: dict[str, dict[int, str]] = {}
    for (outcome, turns), a in zip(finished, adv, strict=True):
        if outcome.status != "done" or not turns:
            continue
        flags = flagged_turns(turns)
        flagged[outcome.rollout] = dict(flags)
        for chain, kind in kinded_chains(turns, kinds, outcome.harness,
                                         keep_retried=keep_retried):
            for r in chain_rows(chain, a, flags, settings, kind):
                rows.append((r.sample, r.advantage, outcome))
                reports.append(_row(r, settings))
    report = GroupReport(
        group=group, harnesses=tuple(o.harness for o, _ in finished), task=task,
        outcomes=tuple(o for o, _ in finished), advantages=tuple(adv),
        rows=tuple(reports),
        captured_tokens={o.rollout: captured_tokens(t) for o, t in finished
                         if o.status == "done"},
        main_chain_tokens={o.rollout: main_chain_tokens(t, keep_retried=keep_retried)
                           for o, t in finished if o.status == "done"},
        spread=has_spread(rewards), flagged=flagged)
    return report, rows


def _row(r: ChainRow, settings: RowSettings) -> Row:
    s = r.sample
    versions = [version_number(v) for v in s.weight_versions]
    version = None if not versions or None in versions else min(
        v for v in versions if v is not None)
    treatment = ("penalty" if r.kind == "penalty" else
                 ",".join(sorted({settings.treatment(f) for _, f in r.flagged})) or "train")
    return Row(s.rollout, s.turns, (*s.prompt_ids, *s.completion_ids), sum(s.mask), version,
               "queued" if version is not None else "untagged", r.advantage,
               r.flagged, r.kind, treatment)


def rollout_sample(s: Sample, advantage: float, version: int, group: int,
                   outcome: Outcome, instruction: str) -> Any:
    """TRL's `RolloutSample`: the mask and logprobs aligned with `input_ids` (0 on the
    prompt and on inserted tokens, which no loss term reads)."""
    import numpy as np

    from harnessrl.train.trl_compat import async_trl

    RolloutSample = async_trl().rollout_sample  # TRL's class
    prompt = len(s.prompt_ids)
    return RolloutSample(
        prompt=[{"role": "user", "content": instruction}], completion=[],
        input_ids=np.asarray([*s.prompt_ids, *s.completion_ids], dtype=np.int64),
        completion_mask=np.asarray([0] * prompt + list(s.mask), dtype=np.int64),
        old_log_probs=np.asarray([0.0] * prompt + s.dense_logprobs(0.0), dtype=np.float32),
        advantage=float(advantage), model_version=version, group_id=group,
        metrics={"reward": float(outcome.reward if outcome.reward is not None else "nan"),
                 "verifier_reward": float(outcome.verifier_reward
                                          if outcome.verifier_reward is not None else "nan")})


def group_metrics(report: GroupReport, current: int) -> dict[str, Any]:
    """One group's metrics in the shape of TRL's sink: floats for counters (`total`) and
    gauges, (numerator, denominator) for rates."""
    out: dict[str, Any] = {"harnessrl/groups_total": 1.0,
                           "harnessrl/infra_errors_total": float(sum(
                               o.status != "done" for o in report.outcomes))}
    by_harness: dict[str, list[Outcome]] = {}
    for o in report.outcomes:
        if o.status == "done":
            by_harness.setdefault(o.harness, []).append(o)
        else:
            _add(out, f"harnessrl/{o.harness}/infra_errors_total", 1.0)
    for harness, outcomes in by_harness.items():
        _add_outcome_rates(out, harness, outcomes)
        keys = {o.rollout for o in outcomes}
        rows = [r for r in report.rows if r.rollout in keys]
        captured = sum(report.captured_tokens[k] for k in keys)
        for prefix in ("harnessrl", f"harnessrl/{harness}"):
            _add(out, f"{prefix}/rows_per_rollout", (len(rows), len(outcomes)))
            _add(out, f"{prefix}/tokens_trained_share",
                 (sum(r.trained_tokens for r in rows), captured))
            _add(out, f"{prefix}/tokens_main_chain_share",
                 (sum(report.main_chain_tokens[k] for k in keys), captured))
    for row in report.rows:
        if row.version is not None:
            _add(out, f"harnessrl/staleness_{current - row.version}_total", 1.0)
        if row.fate != "queued":
            _add(out, f"harnessrl/rows_{row.fate}_dropped_total", 1.0)
    _add_signal(out, report)
    return out


def _add_signal(out: dict[str, Any], report: GroupReport) -> None:
    """Whether the group carried a signal, and what its replies were."""
    fate = report.rows[0].fate if report.rows else "empty"
    _add(out, "harnessrl/groups_with_spread", (float(report.spread), 1.0))
    _add(out, f"harnessrl/groups_{fate}_total", 1.0)
    scored = [a for a, o in zip(report.advantages, report.outcomes, strict=True)
              if o.status == "done"]
    if scored:
        _add(out, "harnessrl/advantage_abs", (sum(abs(a) for a in scored), len(scored)))
        _add(out, "harnessrl/advantage_range", max(scored) - min(scored))
    flags = [f for per in report.flagged.values() for f in per.values()]
    replies = sum(o.turns for o in report.outcomes if o.status == "done")
    for flag in ("rejected", "truncated"):
        _add(out, f"harnessrl/replies_{flag}", (float(flags.count(flag)), replies))
    _add(out, "harnessrl/agent_timeouts_total",
         float(sum(o.agent_timed_out for o in report.outcomes if o.status == "done")))


def group_fate(report: GroupReport, current: int, max_staleness: int,
               drop_uniform: bool) -> str:
    """What becomes of a whole group: queued, or dropped as empty (no row), uniform (no
    reward spread), untagged (a row with no version) or stale (its oldest row is more
    than `max_staleness` versions behind)."""
    versions = [r.version for r in report.rows]
    if not versions:
        return "empty"
    if drop_uniform and not report.spread:
        return "uniform"
    if None in versions:
        return "untagged"
    if current - min(v for v in versions if v is not None) > max_staleness:
        return "stale"
    return "queued"


# What each scored rollout adds per harness, as (sum, count) rates over scored rollouts.
OUTCOME_RATES: dict[str, Callable[[Outcome], float]] = {
    "reward": lambda o: o.reward or 0.0,
    "pass_rate": lambda o: float((o.verifier_reward or 0) >= 1),
    "tool_calls": lambda o: float(o.tool_calls),
    "turns": lambda o: float(o.turns),
    "completion_tokens": lambda o: float(o.completion_tokens),
    # an agent killed at its wall-clock deadline scores as it ended (a 0 if unsolved);
    # counted apart from wrong answers, since a slow engine under load causes them
    "agent_timeouts": lambda o: float(o.agent_timed_out),
}


def _add_outcome_rates(out: dict[str, Any], harness: str, outcomes: list[Outcome]) -> None:
    for name, of in OUTCOME_RATES.items():
        _add(out, f"harnessrl/{harness}/{name}", (sum(of(o) for o in outcomes),
                                                  len(outcomes)))


def _add(out: dict[str, Any], key: str, value: Any) -> None:
    if key not in out:
        out[key] = value
    elif isinstance(value, tuple):
        out[key] = (out[key][0] + value[0], out[key][1] + value[1])
    else:
        out[key] += value


# ------------------------------------------------------------------ the worker
@dataclass
class HarnessRolloutWorker:
    """TRL's `RolloutWorkerProtocol` over `HarnessRollouts` (the proxy, the store and the
    runner), in this process: an event loop on a thread of its own.

    `transfer`, when given, gets the proxy's gate (held during every weight swap) and the
    engine (which it stamps with each new version); with `[cluster]` the rollouts run on
    the Ray cluster's nodes (`HarnessRollouts` on a `ClusterRunner`), and the transfer gets
    every shard's gate and version instead."""

    rollouts: HarnessRollouts
    num_generations: int
    max_inflight: int
    max_staleness: int
    transfer: VersionedTransfer | None = None
    queue_maxsize: int = 0
    call_kinds: tuple[CallKind, ...] | None = None  # the kinds that become rows; None: all
    # The order tasks are drawn in (None: the task list as given) and the first group's
    # number, a resumed run's cursor (train.runs.order, train.runs.checkpoint).
    order: TaskOrder | None = None
    first_group: int = 0
    first_version: int = 0  # the trainer's version counter at the start (train.runs.resume)
    # Runs once the store is open, before the first rollout (a resume marks the rollouts
    # its crash interrupted).
    on_start: Callable[[HarnessRollouts], None] | None = None
    # how rollouts become rows (advantage scale, flagged replies, the control arm)
    settings: RowSettings = field(default_factory=RowSettings)
    drop_uniform: bool = True  # a group with no reward spread is not queued
    # The run's phases (train.async_grpo.schedule): colocated, a group is planned only
    # while the next step needs rows, and no rollout starts during a step.
    schedule: Schedule | None = None
    # typed as TRL's protocol has them; these are in-process queues
    rollout_buffer: queue.Queue | MPQueue = field(init=False)
    metrics_queue: queue.Queue | MPQueue = field(init=False)
    stats: Counter[str] = field(default_factory=Counter)
    reports: deque[GroupReport] = field(default_factory=lambda: deque(maxlen=REPORTS_KEPT))

    def __post_init__(self) -> None:
        if self.num_generations < 1 or self.max_inflight < 1 or self.max_staleness < 0:
            raise ValueError("num_generations and max_inflight must be >= 1, "
                             "max_staleness >= 0")
        self.rollout_buffer = _TakenQueue(self._taken, maxsize=self.queue_maxsize)
        self._origin: dict[int, list[str]] = {}  # id(queued group) -> its rows' rollouts
        self.trained_rollouts: set[str] = set()  # rollouts with a row the trainer took
        self.metrics_queue = queue.Queue()
        self._version = self.first_version
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._heartbeat = time.time()
        self._groups = self.first_group
        self._entered = False
        self._uniform_run = 0  # groups in a row with no reward spread

    # ---------------------------------------------------------------- protocol
    def open(self) -> None:
        """Serve the proxy (or place the cluster's rollout nodes) now, before the trainer
        starts, so a cluster that cannot run rollouts is refused before any training."""
        if not self._entered:
            self.rollouts.__enter__()
            self._entered = True

    def start(self) -> None:
        if self._thread is not None:
            return
        self.open()
        # the harness rotation goes on where the cursor is (one step per group planned)
        self.rollouts.rotation = self.first_group
        if self.on_start is not None:
            self.on_start(self.rollouts)
        if self.transfer is not None:
            self.transfer.gates.extend(self.rollouts.gates())
            sync = self.transfer.sync
            versioned = self.rollouts.versioned()
            if versioned not in sync.engines:
                sync.engines.append(versioned)
            # The cold sync ran before this engine was known: it serves what vLLM says.
            sync.stamp(sync.agreed_version())
        if self.schedule is not None and self.rollouts.cluster is None:
            self.schedule.gates.append(self.rollouts.proxy.gate)  # closed during each step
        self._thread = threading.Thread(target=self._main, name="harnessrl-rollouts",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(120)
            self._thread = None
        if self._entered:
            self._entered = False
            self.rollouts.__exit__(None, None, None)

    @property
    def cursor(self) -> int:
        """Groups planned so far: the next group's number (a checkpoint records it)."""
        return self._groups

    def update_model_version(self, model_version: int) -> None:
        self._version = int(model_version)

    def check_health(self, stale_after_s: float) -> None:
        if self._error is not None:
            raise RuntimeError("the harnessrl rollout worker failed") from self._error
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError("the harnessrl rollout worker is not running")
        if time.time() - self._heartbeat > stale_after_s:
            raise RuntimeError(f"no rollout group finished in {stale_after_s:.0f}s")

    # ---------------------------------------------------------------- the loop
    def _main(self) -> None:
        try:
            asyncio.run(self._generate())
        except BaseException as exc:  # surfaced to the trainer by check_health
            self._error = exc

    async def _generate(self) -> None:
        pending: deque[tuple[int, int, Any]] = deque()  # (group, position, planned)
        groups: dict[int, list[tuple[Outcome, list[Turn]] | None]] = {}
        tasks: dict[asyncio.Task, tuple[int, int]] = {}
        try:
            while not self._stop.is_set():
                if self.schedule is not None and not self.schedule.steps_left():
                    # held by the schedule (a step runs): waiting, not stuck
                    self._heartbeat = time.time()
                while len(tasks) < self.max_inflight and self._may_start(pending, groups):
                    if not pending:
                        pending.extend(self._plan_group(groups))
                    group, position, planned = pending.popleft()
                    task = asyncio.ensure_future(self.rollouts.run_planned([planned]))
                    tasks[task] = (group, position)
                    self.stats["rollouts_started"] += 1
                if not tasks:  # the schedule holds new rollouts: waiting, not stuck
                    self._heartbeat = time.time()
                    await asyncio.sleep(POLL_SECONDS)
                    continue
                done, _ = await asyncio.wait(tasks, timeout=POLL_SECONDS,
                                             return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    group, position = tasks.pop(task)
                    [outcome] = task.result()
                    turns = await asyncio.to_thread(self.rollouts.seen_turns, outcome.rollout)
                    groups[group][position] = (outcome, turns)
                    self.stats["rollouts"] += 1
                    if all(r is not None for r in groups[group]):
                        await asyncio.to_thread(self._finish, group, groups.pop(group))
        finally:
            for task in tasks:
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(*tasks, return_exceptions=True)

    def _may_start(self, pending: deque[Any], groups: dict[int, list[Any]]) -> bool:
        """Whether a rollout may start now (train.async_grpo.schedule): the rest of a group
        under way whenever the sampler samples; a new group only while the next step wants
        groups."""
        s = self.schedule
        if s is None or not s.colocated:
            return True
        if pending:
            return s.phase == "sampling"
        unscored = sum(len(g) for g in groups.values())
        if s.wants_rollouts(self.stats["groups_queued"], unscored, 1 / self.num_generations):
            return True
        # Groups the trainer took and dropped (stale in its queue) count as queued: when it
        # has taken every group and nothing is under way, it still waits for a batch.
        return not unscored and self.rollout_buffer.empty() and s.steps_left()

    def _taken(self, item: GroupItem) -> None:
        """The trainer took a group from the queue: its rollouts are trained."""
        self.stats["rows_taken"] += len(item.samples)
        self.stats["groups_taken"] += 1
        self.trained_rollouts.update(self._origin.pop(id(item), ()))

    def _plan_group(self, groups: dict[int, list[Any]]) -> list[tuple[int, int, Any]]:
        """The next group: the next task for the next harness (tasks advance once every
        harness has had one, so every pair meets)."""
        group = self._groups
        self._groups += 1
        tasks = self.rollouts.tasks
        n = len(self.rollouts.harnesses)
        task = (self.order.at(group // n) if self.order is not None
                else tasks[(group // n) % len(tasks)])
        planned = self.rollouts.plan([task.id] * self.num_generations, self.num_generations)
        groups[group] = [None] * len(planned)
        return [(group, i, p) for i, p in enumerate(planned)]

    def _finish(self, group: int, finished: list[Any]) -> None:
        """Score the group and queue it whole, or drop it whole and say why."""
        task = finished[0][0].task
        report, rows = score_group(group, task, finished, self.settings, self.call_kinds,
                                   keep_retried=self.rollouts.train_retried)
        instruction = next((t.instruction for t in self.rollouts.tasks if t.id == task), task)
        current = self._version
        fate = group_fate(report, current, self.max_staleness, self.drop_uniform)
        if fate == "queued":
            version = min(r.version for r in report.rows if r.version is not None)
            item = GroupItem(group, version, [
                rollout_sample(s, advantage, row.version or version, group, outcome,
                               instruction)
                for (s, advantage, outcome), row in zip(rows, report.rows, strict=True)],
                [o.reward for o in report.outcomes
                 if o.status == "done" and o.reward is not None])
            self._origin[id(item)] = [outcome.rollout for _, _, outcome in rows]
            self._put(item)
        report = _with_fates(report, [fate] * len(report.rows))
        self._warn_if_no_signal(fate)
        self.stats["rows_all"] += len(report.rows)
        self.stats["rollouts_scored"] += sum(o.status == "done" for o in report.outcomes)
        self.reports.append(report)
        self.stats["groups"] += 1
        self.stats[f"groups_{fate}"] += 1
        self.stats[f"rows_{fate}"] += len(report.rows)
        self.stats["infra_errors"] += sum(o.status != "done" for o in report.outcomes)
        self.metrics_queue.put(group_metrics(report, current))
        self._heartbeat = time.time()

    def _warn_if_no_signal(self, fate: str) -> None:
        """Uniform groups (no reward spread) and empty ones (every reply masked, e.g. all
        cut by max_tokens) are not trained, so a run where every group is one of them
        takes no step (and logs nothing): say so every `UNIFORM_WARN`."""
        self._uniform_run = self._uniform_run + 1 if fate in ("uniform", "empty") else 0
        if self._uniform_run and self._uniform_run % UNIFORM_WARN == 0:
            print(f"harnessrl: the last {self._uniform_run} groups were not trained: their "
                  "rollouts all had the same reward (grpo.drop_uniform_groups) or no reply "
                  "left unmasked (grpo.truncated_turns, rejected_turns: e.g. every reply "
                  "cut by max_tokens); no step is taken until a group has both",
                  file=sys.stderr, flush=True)

    def _put(self, item: Any) -> None:
        """Queue a row; a full queue (`queue_maxsize`) holds the worker, so no new rollout
        starts until the trainer takes rows. A worker held so is waiting, not stuck: its
        heartbeat stays fresh for TRL's health check."""
        while not self._stop.is_set():
            try:
                self.rollout_buffer.put(item, timeout=POLL_SECONDS)
                return
            except queue.Full:
                self._heartbeat = time.time()


class _TakenQueue(queue.Queue):
    """The rollout queue, telling the worker which rows the trainer took."""

    def __init__(self, on_take: Callable[[Any], None], maxsize: int = 0) -> None:
        super().__init__(maxsize)
        self._on_take = on_take

    def _get(self) -> Any:
        item = super()._get()
        self._on_take(item)
        return item


def _with_fates(report: GroupReport, fates: list[str]) -> GroupReport:
    from dataclasses import replace

    rows = tuple(replace(r, fate=f) for r, f in zip(report.rows, fates, strict=True))
    return replace(report, rows=rows)
