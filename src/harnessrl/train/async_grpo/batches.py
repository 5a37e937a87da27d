"""Whole GRPO groups per optimizer step, for TRL 1.16's `AsyncGRPOTrainer`.

TRL batches a fixed number of rows, but a rollout here is one row per chain, so a fixed
row count cuts groups: a group's rows straddle steps, a step's advantages do not sum to
zero, and a stale tail can be dropped apart from its head. Here the worker queues a
*group* (`GroupItem`: every row of every rollout of it), and the trainer's data path is:

- `GroupQueue`: takes groups off the worker's queue; a group older than `max_staleness`
  (its oldest row's version) is dropped whole and counted, never in part.
- `GroupBatcher`: `tasks_per_step` groups make one micro-batch, which is the whole step
  (gradient accumulation is refused: TRL scales each micro-batch's loss by its own token
  count). With `scale_rewards = "batch"` it divides the step's centred advantages by the
  std of the step's rewards. Rows are spread over the trainer's processes as TRL does:
  a group's rows together, costliest group first into the least loaded process.
- `group_trainer(TRL's class)`: a subclass that reads batches so, and whose optimizer does
  not step on a batch with no gradient (no trained token with a non-zero advantage):
  AdamW's moments and weight decay would move the weights anyway.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from harnessrl.train.common import NO_GRADIENT
from harnessrl.train.rows.grpo import Scale, batch_divisor
from harnessrl.train.rows.importance import STATS, Importance, correct, measure, metrics

POLL_SECONDS = 5.0  # TRL's poll of its rollout queue; the health check runs between polls


@dataclass
class GroupItem:
    """One group as queued: its rows (TRL `RolloutSample`s), the oldest weight version
    of any of them, and its scored rewards (for `scale_rewards = "batch"`)."""

    group: int
    version: int
    samples: list[Any]
    rewards: list[float]
    enqueued_at: float = field(default_factory=time.time)


def _metric(sink: Any, key: str, value: Any) -> None:
    sink[key].append(value)


def _dataset_base() -> type:
    import torch

    return torch.utils.data.IterableDataset


class GroupQueue(_dataset_base()):  # type: ignore[misc]
    """Groups off the worker's queue, stale ones dropped whole (counted in TRL's
    `sample/dropped_stale_total` by rows and in `harnessrl/groups_stale_dropped_total`)."""

    def __init__(self, source: Any, version: Callable[[], int],
                 check_health: Callable[[float], None], stale_after_s: float, metrics: Any,
                 max_staleness: int, poll_s: float = POLL_SECONDS) -> None:
        self.source, self.version, self.check_health = source, version, check_health
        self.stale_after_s, self.metrics = stale_after_s, metrics
        self.max_staleness, self.poll_s = max_staleness, poll_s
        self.wait_s = 0.0  # read and reset by TRL's step metrics (perf/rollout_wait_s)

    def _get(self) -> GroupItem:
        started = time.time()
        while True:
            try:
                item = self.source.get(timeout=self.poll_s)
                break
            except queue.Empty:
                self.check_health(self.stale_after_s)
        self.wait_s += time.time() - started
        return item

    def __iter__(self) -> Iterator[GroupItem]:
        while True:
            item = self._get()
            staleness = self.version() - item.version
            if staleness > self.max_staleness:
                _metric(self.metrics, "sample/dropped_stale_total", float(len(item.samples)))
                _metric(self.metrics, "harnessrl/groups_stale_dropped_total", 1.0)
                continue
            _metric(self.metrics, "sample/staleness_mean", float(staleness))
            _metric(self.metrics, "sample/staleness_max", float(staleness))
            _metric(self.metrics, "sample/time_in_queue_s", time.time() - item.enqueued_at)
            yield item


def as_row(sample: Any, divisor: float = 1.0) -> dict[str, Any]:
    """TRL's row dict (what its `RolloutQueueDataset` yields) from a `RolloutSample`."""
    return {"input_ids": sample.input_ids, "completion_mask": sample.completion_mask,
            "old_log_probs": sample.old_log_probs, "advantage": sample.advantage / divisor,
            "group_id": sample.group_id, "metrics": sample.metrics}


class GroupBatcher(_dataset_base()):  # type: ignore[misc]
    """`groups_per_step` whole groups per micro-batch, partitioned over the
    `num_processes` processes as TRL's `FixedCountBatcher` partitions them."""

    def __init__(self, groups: Any, num_processes: int, groups_per_step: int, scale: Scale,
                 metrics: Any, tree_row: Callable[[], Any]) -> None:
        self.groups, self.num_processes = groups, num_processes
        self.groups_per_step = groups_per_step
        self.scale: Scale = scale
        self.metrics, self.tree_row = metrics, tree_row

    def __iter__(self) -> Iterator[list[Any]]:
        batch: list[GroupItem] = []
        for item in self.groups:
            batch.append(item)
            if len(batch) == self.groups_per_step:
                yield self.partition(step_rows(batch, self.scale, self.metrics))
                batch = []

    def partition(self, groups: list[list[dict[str, Any]]]) -> list[Any]:
        groups = [g for g in groups if g]
        while len(groups) < self.num_processes:  # every process forwards something
            largest = groups.pop(max(range(len(groups)), key=lambda i: len(groups[i])))
            groups += [largest[:len(largest) // 2], largest[len(largest) // 2:]]
        priced = []
        for group in groups:
            priced.append(self.tree_row())
            for row in group:
                priced[-1].add(row)
        rows = [self.tree_row() for _ in range(self.num_processes)]
        for group in sorted(priced, key=lambda r: r.load, reverse=True):
            target = min(rows, key=lambda r: r.load)
            for row in group.samples:
                target.add(row)
        return rows


def step_rows(batch: list[GroupItem], scale: Scale, metrics: Any) -> list[list[dict[str, Any]]]:
    """The step's rows, group by group, with `"batch"` scaling applied."""
    divisor = batch_divisor([r for g in batch for r in g.rewards]) if scale == "batch" else 1.0
    _metric(metrics, "harnessrl/step_groups", float(len(batch)))
    _metric(metrics, "harnessrl/step_rows", float(sum(len(g.samples) for g in batch)))
    _metric(metrics, "harnessrl/step_trained_tokens", float(sum(
        int(s.completion_mask.sum()) for g in batch for s in g.samples)))
    return [[as_row(s, divisor) for s in g.samples] for g in batch]


class _Corrected:
    """The model as TRL's loss calls it, its log-probs corrected (`importance.correct`)
    and measured on the way out."""

    def __init__(self, model: Any, trainer: Any, inputs: Any, settings: Importance) -> None:
        selected = inputs["token_index"] >= 0
        self.model, self.trainer, self.settings = model, trainer, settings
        self.index = inputs["token_index"][selected]
        self.old = inputs["old_log_probs"][selected]
        self.advantages = inputs["advantages"][selected]

    def __call__(self, **kwargs: Any) -> Any:
        outputs = self.model(**kwargs)
        flat = outputs.log_probs.flatten()
        log_probs = flat[self.index]
        fixed, masked = correct(log_probs, self.old, self.advantages, self.settings)
        # a position several rows share takes one row's value (rare: rows of a rollout
        # share sampled tokens only where chains overlap)
        out = flat.clone()
        out[self.index] = fixed
        outputs.log_probs = out.view_as(outputs.log_probs)
        self.trainer._record_correction(
            measure(log_probs, self.old, self.advantages, masked, self.settings),
            torch_exp_max(log_probs.detach() - self.old))
        return outputs


def torch_exp_max(log_rho: Any) -> Any:
    import torch

    return torch.exp(log_rho).max() if log_rho.numel() else torch.zeros((), device=log_rho.device)


class GroupReading:
    """What `group_trainer` adds to TRL's trainer (a mixin before it in the MRO): batches
    of whole groups, an optimizer that skips a step with no live token, and log-probs
    corrected against the engine's when `_importance` is set. Its settings are class
    attributes, set by `group_trainer`."""

    _groups_per_step: int
    _scale: Scale
    _importance: Importance | None
    _live_tokens = 0.0

    def get_train_dataloader(self) -> Any:
        from torch.utils.data import DataLoader

        from harnessrl.train import trl_compat as compat

        trainer: Any = self
        if not trainer.accelerator.is_main_process:
            return super().get_train_dataloader()  # type: ignore[misc]
        n = trainer.accelerator.num_processes
        sink = compat.metrics_sink(trainer)
        groups = GroupQueue(trainer.rollout_queue, lambda: trainer.model_version,
                            trainer.rollout_worker.check_health,
                            trainer.args.heartbeat_stale_after_s, sink,
                            trainer.args.max_staleness)
        compat.set_rollout_dataset(trainer, groups)  # TRL's step metrics read its wait
        batches = GroupBatcher(groups, n, self._groups_per_step, self._scale, sink,
                               compat.tree_row)
        collate = compat.rollout_collator(trainer, n, sink)
        return trainer.accelerator.prepare(DataLoader(batches, batch_size=1,
                                                      collate_fn=collate, num_workers=0))

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        import torch

        loss = super().compute_loss  # type: ignore[misc]
        if self._importance is not None:
            corrected = _Corrected(model, self, inputs, self._importance)
            return loss(corrected, inputs, return_outputs, num_items_in_batch)
        accelerator: Any = self.accelerator  # type: ignore[attr-defined]
        live = ((inputs["advantages"] != 0) & (inputs["token_index"] >= 0)).sum()
        self._live_tokens += float(accelerator.reduce(live.to(torch.float32), reduction="sum"))
        return loss(model, inputs, return_outputs, num_items_in_batch)

    def _record_correction(self, sums: Any, ratio_max: Any) -> None:
        from harnessrl.train import trl_compat as compat

        accelerator: Any = self.accelerator  # type: ignore[attr-defined]
        sums = accelerator.reduce(sums.float(), reduction="sum").tolist()
        ratio_max = float(accelerator.gather(ratio_max.reshape(1).float()).max())
        named = dict(zip(STATS, sums, strict=True))
        self._live_tokens += named["live"]
        sink = compat.metrics_sink(self)
        for key, value in metrics(named, ratio_max).items():
            sink[key].append(value)

    def create_optimizer(self, model: Any = None) -> Any:
        from harnessrl.train.common import guard_optimizer

        optimizer = super().create_optimizer(model)  # type: ignore[misc]
        guard_optimizer(optimizer, self._take_gradient, self._skipped)
        return optimizer

    def _take_gradient(self) -> bool:
        live, self._live_tokens = self._live_tokens, 0.0
        return live > 0

    def _skipped(self) -> None:
        from harnessrl.train import trl_compat as compat

        compat.metrics_sink(self)[NO_GRADIENT].append(1.0)


def group_trainer(base: type, *, groups_per_step: int, scale: Scale,
                  importance: Importance | None = None) -> type:
    """`base` (TRL's `AsyncGRPOTrainer`) reading whole groups, its optimizer guarded,
    its log-probs corrected against the engine's when `importance` is given."""
    return type("GroupGRPOTrainer", (GroupReading, base),
                {"_groups_per_step": groups_per_step, "_scale": scale,
                 "_importance": importance})

