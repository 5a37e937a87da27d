"""What a long run adds around either trainer (`train_async`, the sync `loop._train`):
checkpoints, the resume, the trained model directory and eval while training, as a few
hooks into the trainer and its rollouts (train.runs.checkpoint, train.runs.resume,
train.runs.eval_during hold the parts).

`LongRun` is built before the trainer, from the run's settings and the trainer's `Seam`
(what a checkpoint records of it); it says which trainer class to build (one whose
checkpoints are atomic), what the rollouts and the version counter start from (the task
cursor, the resume's marking of interrupted rollouts, the first version), and gives the
callbacks that start eval passes and log them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rich.console import Console

from harnessrl.train.common import METRICS_FILE, fmt
from harnessrl.train.config import TrainSettings
from harnessrl.train.runs import checkpoint as ckpt
from harnessrl.train.runs.eval_during import PLOT_FILE, EvalDuringTraining, EvalPass, plot
from harnessrl.train.runs.order import TaskOrder
from harnessrl.train.runs.resume import first_version, mark_interrupted, resumed_state
from harnessrl.train.trl_compat import with_checkpoint_saver

if TYPE_CHECKING:
    from transformers import TrainerCallback

    from harnessrl.rollout.tasks.task import Task
    from harnessrl.train.trl import HarnessRollouts


@runtime_checkable
class Seam(Protocol):
    """What a long run asks of a trainer for its checkpoints (`harnessrl_state.json`):
    the groups drawn from its task order so far and the weight version vLLM serves.
    Each trainer kept has one: `async_grpo.loop.ASYNC`, `loop.SYNC`."""

    def cursor(self, trainer: Any) -> int: ...

    def weight_version(self, trainer: Any) -> int: ...


def saving(every_steps: int) -> dict[str, Any]:
    """TRL's save settings for `[checkpoint] every_steps`: its save points are where
    `trainer_class`'s trainer writes this run's checkpoints."""
    if not every_steps:
        return {"save_strategy": "no"}
    return {"save_strategy": "steps", "save_steps": every_steps, "save_total_limit": None}


@dataclass
class LongRun:
    config: TrainSettings
    run_dir: Path
    tasks: Sequence[Task]  # the training tasks
    console: Console
    metrics: Path
    seam: Seam  # the trainer's (what its checkpoints record)
    resume: ckpt.Resume | None = None
    evaluation: EvalDuringTraining | None = None
    checkpoints: list[dict[str, Any]] = field(default_factory=list)  # per save: seconds, bytes
    trainer: Any = None  # the trainer of `trainer_class`, once built (it logs the evals)

    def __post_init__(self) -> None:
        self.fingerprint = ckpt.fingerprint(self.config, [t.id for t in self.tasks])
        self.order = TaskOrder(list(self.tasks), self.config.grpo.seed)

    # ---------------------------------------------------------------- before the trainer
    @property
    def first_group(self) -> int:
        return int(self.resume.state.get("task_cursor", 0)) if self.resume else 0

    @property
    def resumed_step(self) -> int:
        """The optimizer step the run goes on from (0: a new run)."""
        return self.resume.step if self.resume else 0

    @property
    def resume_from(self) -> str | None:
        """For TRL's `train(resume_from_checkpoint=...)`."""
        return None if self.resume is None else str(self.resume.path)

    def trainer_class(self, base: type) -> type:
        """`base` (TRL's trainer, async or sync) built for this run: its checkpoints are this run's
        (atomic, with harnessrl's state) and its eval passes are logged through it."""
        run = self

        class LongRunTrainer(base):  # type: ignore[valid-type, misc]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                run.trainer = self

        if not self.config.checkpoint.every_steps:
            return LongRunTrainer
        return with_checkpoint_saver(LongRunTrainer, self._save)

    def first_version(self, served: str | None) -> int:
        """The version counter to start from: 0, or above every version used before."""
        if self.resume is None:
            return 0
        return first_version(int(self.resume.state.get("weight_version", 0)), self.run_dir,
                             served)

    def on_worker_start(self, rollouts: HarnessRollouts) -> None:
        """Once the rollouts are open, before the first one: the async worker's `start`
        (after the cold sync), the sync trainer's `with rollouts:`."""
        if self.resume is not None:
            marked = mark_interrupted(rollouts.store, f"in flight when the run stopped; "
                                      f"resumed from {self.resume.path}")
            rollouts.resume_samples(rollouts.store)
            self.console.print(f"resumed from {self.resume.path} at step "
                               f"{self.resume.step}: {len(marked)} interrupted rollouts "
                               "marked, never trained")
        if self.evaluation is not None:
            rollouts.add_tasks(self.evaluation.tasks)
            self.evaluation.rollouts = rollouts

    # ---------------------------------------------------------------- checkpoints
    def _save(self, trainer: Any) -> None:
        started = time.monotonic()
        c = self.config.checkpoint
        state = resumed_state(self.seam.cursor(trainer), self.seam.weight_version(trainer),
                              self.fingerprint)
        path = ckpt.save(trainer, ckpt.checkpoint_root(self.config), state, c.keep)
        ckpt.publish_checkpoint(trainer, path, self.run_dir)
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        seconds = time.monotonic() - started
        self.checkpoints.append({"step": int(trainer.state.global_step), "seconds": seconds,
                                 "bytes": size})
        self.console.print(f"checkpoint {path} ({size / 1e6:.1f} MB, {seconds:.1f} s)"
                           f" · model: {self.run_dir / ckpt.MODEL_DIR}")

    def finish(self, trainer: Any) -> Path:
        """RUN_DIR/model/ from the final weights (unless the last checkpoint wrote it)."""
        last = self.checkpoints[-1]["step"] if self.checkpoints else None
        if last == trainer.state.global_step:
            return self.run_dir / ckpt.MODEL_DIR
        return ckpt.save_final_model(trainer, self.run_dir)

    # ---------------------------------------------------------------- eval
    def callback(self) -> TrainerCallback:
        from transformers import TrainerCallback

        run = self

        class EvalCallback(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
                run.report_evals()
                if run.evaluation is not None:
                    run.evaluation.maybe_start(int(state.global_step), int(state.max_steps))

            def on_train_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
                if run.evaluation is not None:
                    run.evaluation.wait()
                run.report_evals()

        return EvalCallback()

    def report_evals(self) -> None:
        if self.evaluation is None:
            return
        for done in self.evaluation.finished():
            self._report(done)

    def _report(self, done: EvalPass) -> None:
        """metrics.jsonl, report_to (at the pass's step) and the plot."""
        with self.metrics.open("a") as f:
            f.write(json.dumps(done.line()) + "\n")
        self.console.print(_eval_row(done))
        if self.trainer is not None and self.config.grpo.report_to:
            from transformers import Trainer

            state = self.trainer.state
            now, state.global_step = state.global_step, done.step
            try:  # the base log: TRL's would take the step's train metrics with it
                Trainer.log(self.trainer, done.logs())
            finally:
                state.global_step = now
        plot(self.metrics, self.run_dir / PLOT_FILE)


def _eval_row(done: EvalPass) -> str:
    per = ", ".join(f"{r.harness} {fmt(r.pass_rate, '.0%')} ({fmt(r.ci_low, '.0%')}-"
                    f"{fmt(r.ci_high, '.0%')}), "
                    f"{r.infra_errors} infra" for r in done.rows)
    return f"eval at step {done.step}: pass@1 {per or '-'} · {done.seconds:.0f} s"


def is_eval_log(logs: dict[str, Any]) -> bool:
    return any(k.startswith("eval_") for k in logs)


# ------------------------------------------------------------------ built from the config
SPLIT_FILE = "split.json"


def long_run(config: TrainSettings, tasks: Sequence[Task], console: Console,
             resume: str | None, seam: Seam) -> LongRun:
    """The run's training tasks (the eval split held out), its checked resume and its eval;
    refuses, before anything starts, a checkpoint that cannot be resumed (named)."""
    from harnessrl.train.runs.resume import rewind_metrics

    run_dir = Path(config.run_dir)
    train_tasks, eval_tasks = _split(config, list(tasks), run_dir)
    found = None
    if resume is not None:
        found = ckpt.prepare_resume(resume, config, [t.id for t in train_tasks])
    metrics = run_dir / METRICS_FILE
    if found is not None:
        undone = rewind_metrics(metrics, found.step)
        if undone:
            console.print(f"{undone} metrics lines of steps after {found.step} moved to "
                          "metrics.undone.jsonl")
    evaluation = evaluation_of(config, eval_tasks, run_dir) if eval_tasks else None
    return LongRun(config, run_dir, train_tasks, console, metrics, seam, found, evaluation)


def _split(config: TrainSettings, tasks: list[Task], run_dir: Path
           ) -> tuple[list[Task], list[Task]]:
    """(training tasks, eval tasks): a second task set, or a seeded split recorded in
    RUN_DIR/split.json."""
    from harnessrl.rollout.tasks.task import load_tasks
    from harnessrl.train.runs.order import split

    e = config.eval
    if not e.every_steps:
        return tasks, []
    if e.tasks is not None:
        return tasks, load_tasks(e.tasks)
    kept, held = split([t.id for t in tasks], e.holdout, config.grpo.seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / SPLIT_FILE).write_text(json.dumps(
        {"seed": config.grpo.seed, "holdout": e.holdout, "tasks": config.rollout.tasks,
         "train": kept, "eval": held}, indent=1))
    chosen = set(held)
    return [t for t in tasks if t.id not in chosen], [t for t in tasks if t.id in chosen]


def evaluation_of(config: TrainSettings, tasks: Sequence[Task], run_dir: Path
                  ) -> EvalDuringTraining:
    import msgspec

    from harnessrl.harnesses import get
    from harnessrl.train.trl import on_policy_sampling
    from harnessrl.types import Sampling

    e, engine = config.eval, config.engine
    temperature = engine.temperature if e.temperature is None else e.temperature
    sampling = (on_policy_sampling(temperature, engine.max_tokens) if engine.on_policy
                else Sampling(max_tokens=engine.max_tokens, temperature=temperature))
    settings = msgspec.structs.replace(
        config.rollout, concurrency=e.slots,
        max_model_calls=e.max_model_calls or config.rollout.max_model_calls)
    names = e.harnesses or config.rollout.harnesses
    return EvalDuringTraining(
        every_steps=e.every_steps, tasks=list(tasks), harnesses=[get(n) for n in names],
        samples=e.samples, settings=settings, sampling=sampling,
        shaping=config.shaping, run_dir=run_dir)
