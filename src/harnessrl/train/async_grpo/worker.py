"""Asynchronous GRPO: a rollout worker for TRL 1.16's `AsyncGRPOTrainer`.

`HarnessRolloutWorker` implements TRL's `RolloutWorkerProtocol` in this process: real
harnesses run on tasks through the capture proxy, `max_inflight` at a time and without
pause, while the trainer takes its steps. Rollouts are planned in GRPO groups of
`num_generations`, one harness per group, rotating (`mix="generation"` alternates the
harnesses within a group instead; `train.trl.HarnessRollouts` plans both). When a group's
last rollout ends, the group is scored (groups.py) and pushed to TRL's rollout queue:

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
  (see `train.async_grpo.transfer`). A group whose oldest row is already older than `max_staleness`
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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harnessrl.train.async_grpo.batches import GroupItem
from harnessrl.train.async_grpo.groups import (
    GroupReport,
    group_fate,
    group_metrics,
    rollout_sample,
    score_group,
    with_fates,
)
from harnessrl.train.async_grpo.transfer import VersionedTransfer
from harnessrl.train.rows.grpo import RowSettings
from harnessrl.train.runs.order import TaskOrder
from harnessrl.train.trl import HarnessRollouts
from harnessrl.types import CallKind, Outcome, Turn

if TYPE_CHECKING:
    from multiprocessing.queues import Queue as MPQueue

    from harnessrl.train.async_grpo.schedule import Schedule

POLL_SECONDS = 0.2
UNIFORM_WARN = 20  # uniform groups in a row between two warnings
REPORTS_KEPT = 2000


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
                rollout_sample(s, advantage, version if row.version is None else row.version,
                               group, outcome, instruction)
                for (s, advantage, outcome), row in zip(rows, report.rows, strict=True)],
                [o.reward for o in report.outcomes
                 if o.status == "done" and o.reward is not None])
            self._origin[id(item)] = [outcome.rollout for _, _, outcome in rows]
            self._put(item)
        report = with_fates(report, [fate] * len(report.rows))
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
        """Queue a group; a full queue (`queue_maxsize`) holds the worker, so no new rollout
        starts until the trainer takes groups. A worker held so is waiting, not stuck: its
        heartbeat stays fresh for TRL's health check."""
        while not self._stop.is_set():
            try:
                self.rollout_buffer.put(item, timeout=POLL_SECONDS)
                return
            except queue.Full:
                self._heartbeat = time.time()


class _TakenQueue(queue.Queue):
    """The rollout queue, telling the worker which groups the trainer took."""

    def __init__(self, on_take: Callable[[Any], None], maxsize: int = 0) -> None:
        super().__init__(maxsize)
        self._on_take = on_take

    def _get(self) -> Any:
        item = super()._get()
        self._on_take(item)
        return item
