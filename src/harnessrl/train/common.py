"""What both trainers (the synchronous `loop` and the asynchronous `async_grpo.loop`) share,
so that neither imports the other for it: the sampling, a quiet trainer log, an
optimizer that does not step without a gradient, how rollouts become rows, and the name
of the per-step log."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harnessrl.train.config import TrainSettings
from harnessrl.types import Sampling

if TYPE_CHECKING:
    from harnessrl.train.rows.grpo import RowSettings

METRICS_FILE = "metrics.jsonl"  # a run directory's per-step log, one JSON line a step
# what either trainer logs (report_to) for a step its optimizer skipped: no gradient
NO_GRADIENT = "harnessrl/steps_without_gradient_total"


def fmt(value: Any, spec: str = ".3f") -> str:
    """A figure for a progress line or a table: "-" when it was not measured."""
    return "-" if value is None else format(value, spec)


def sampling_of(config: TrainSettings) -> Sampling:
    """What every call is sampled with, overriding the harness (see EngineSettings)."""
    from harnessrl.train.trl import on_policy_sampling

    e = config.engine
    if not e.on_policy:
        return Sampling(max_tokens=e.max_tokens, temperature=e.temperature)
    return on_policy_sampling(e.temperature, e.max_tokens)


def quiet(trainer: Any) -> None:
    """Our step lines and progress replace the trainer's printed log dicts and tqdm bar."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)


# ------------------------------------------------------------------ the optimizer's guard
def guard_optimizer(optimizer: Any, has_gradient: Callable[[], bool],
                    on_skip: Callable[[], None]) -> None:
    """The optimizer steps only when `has_gradient()`; otherwise `on_skip()` and nothing
    moves. (The LR scheduler still counts the step: its schedule is in steps taken by the
    trainer, skipped or not.)"""
    if getattr(optimizer, "_harnessrl_guarded", False):
        return  # create_optimizer may hand back the optimizer it made before
    step = optimizer.step

    @functools.wraps(step)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if has_gradient():
            return step(*args, **kwargs)
        on_skip()
        return None

    optimizer.step = guarded
    optimizer._harnessrl_guarded = True


def has_gradient(model: Any) -> bool:
    """Whether any parameter has a non-zero gradient."""
    return any(p.grad is not None and bool(p.grad.any()) for p in model.parameters())


def guarded_trainer(base: type) -> type:
    """`base` (TRL's sync `GRPOTrainer`) whose optimizer does not step when every
    gradient is zero (every rollout's advantage 0, or every reply masked)."""
    from harnessrl.train.trl_compat import metrics_sink

    class GuardedTrainer(base):  # type: ignore[valid-type, misc]
        def create_optimizer(self, model: Any = None) -> Any:
            optimizer = super().create_optimizer(model)
            guard_optimizer(optimizer, lambda: has_gradient(self.model), self._skipped)
            return optimizer

        def _skipped(self) -> None:
            metrics_sink(self)[NO_GRADIENT].append(1.0)

    return GuardedTrainer


def row_settings(config: TrainSettings) -> RowSettings:
    """How either trainer turns rollouts into rows, from `[grpo]`."""
    from harnessrl.train.rows.grpo import RowSettings

    g = config.grpo
    return RowSettings(scale_rewards=g.scale_rewards, rejected_turns=g.rejected_turns,
                       truncated_turns=g.truncated_turns, format_penalty=g.format_penalty,
                       advantage_control=g.advantage_control, seed=g.seed)
