"""`harnessrl train`: GRPO steps end to end from one config.

vLLM serves the policy (started here unless the config names a running one); the capture
proxy sits in front of it (several servers: `engine.urls` or `engine.servers`, see
`train.engines`); each step TRL asks `HarnessRollouts` for a batch (real
harnesses on tasks, scored by the tasks' verifiers), takes an optimizer step on the exact
captured tokens, and the weights go back to vLLM by file with a new version name that
every later turn records. Per step, one line of `metrics.jsonl` in the run directory:
reward, pass rate per harness, tool calls, tokens, chain extension rate, weight versions,
and TRL's own numbers (loss, grad norm, ...). Checkpoints, `--resume` and eval while
training are the long run's (`train.runs.long_run`), as for the async trainer; `SYNC` is
what a checkpoint records of this trainer.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import fmean
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harnessrl.rollout.analysis.chains import ChainStats
from harnessrl.train.async_grpo.loop import (
    ASYNC,
    check_config,
    train_async,
    train_async_rank,
)
from harnessrl.train.async_grpo.processes import check_processes, process_state
from harnessrl.train.common import (
    METRICS_FILE,
    NO_GRADIENT,
    fmt,
    quiet,
    row_settings,
    sampling_of,
)
from harnessrl.train.config import TrainSettings, trainer_dtype
from harnessrl.train.engines import PolicyEngines, node_engines, policy_engines
from harnessrl.train.runs.long_run import LongRun, is_eval_log, long_run, saving
from harnessrl.train.trl import Batch, RolloutRecord

if TYPE_CHECKING:
    from transformers import TrainerCallback
    from trl import GRPOConfig

    from harnessrl.harnesses.base import Harness
    from harnessrl.rollout.tasks.task import Task
    from harnessrl.train.trl import HarnessRollouts


# ------------------------------------------------------------------ metrics
def _mean(values: list[float]) -> float | None:
    return fmean(values) if values else None


def _group(records: list[RolloutRecord]) -> dict[str, Any]:
    done = [r for r in records if r.outcome.status == "done"]
    rewards = [r.outcome.reward for r in done if r.outcome.reward is not None]
    stats = ChainStats()
    for record in records:
        stats.add(record.stats)
    return {
        "rollouts": len(records), "infra_errors": len(records) - len(done),
        "reward": _mean(rewards),
        "pass_rate": sum(r.solved for r in done) / len(done) if done else None,
        "tool_calls": _mean([r.outcome.tool_calls for r in done]),
        "completion_tokens": _mean([r.outcome.completion_tokens for r in done]),
        "turns": _mean([r.outcome.turns for r in done]),
        "agent_timeouts": sum(r.outcome.agent_timed_out for r in done),
        "chains": stats.chains, "chain_extension_rate": stats.extension_rate,
        "chain_breaks": dict(stats.breaks),
    }


def batch_metrics(batch: Batch) -> dict[str, Any]:
    """What one step's rollouts did, overall and per harness."""
    trained = [r.sample for r in batch.records if r.sample is not None]
    by_harness: dict[str, list[RolloutRecord]] = {}
    for record in batch.records:
        by_harness.setdefault(record.outcome.harness, []).append(record)
    return {
        **_group(batch.records),
        "trained_sequences": len(trained),
        "groups_with_spread": _spread_share(batch.records),
        "trained_tokens": sum(sum(s.mask) for s in trained),
        "sampled_with": sorted({v for s in trained for v in s.weight_versions if v}),
        "rollout_seconds": round(batch.seconds, 2),
        "harnesses": {name: _group(group) for name, group in sorted(by_harness.items())},
    }


def _spread_share(records: list[RolloutRecord]) -> float | None:
    """Share of the step's groups (a task's consecutive rollouts, as TRL lays them out)
    whose scored rewards differ."""
    from itertools import groupby

    from harnessrl.train.rows.grpo import has_spread

    groups = [[r.outcome.reward if r.outcome.status == "done" else None for r in group]
              for _, group in groupby(records, key=lambda r: r.outcome.task)]
    return sum(has_spread(g) for g in groups) / len(groups) if groups else None


class StepLog:
    """Collects one metrics line per optimizer step (TRL's log + our batch), writes it to
    `metrics.jsonl` and prints a row."""

    def __init__(self, path: Path, rollouts: HarnessRollouts, console: Console,
                 on_step: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.path = path
        self.rollouts = rollouts
        self.console = console
        self.on_step = on_step
        self.steps: list[dict[str, Any]] = []

    def add(self, step: int, logs: dict[str, Any]) -> None:
        batch = self.rollouts.batches[-1] if self.rollouts.batches else None
        sync = self.rollouts.sync
        line = {"step": step, **(batch_metrics(batch) if batch else {}),
                "weight_version": None if sync is None else sync.agreed_version(),
                "sync_seconds": None if sync is None or not sync.seconds
                else round(sync.seconds[-1], 3),
                "no_gradient": int(bool(logs.get(NO_GRADIENT))),
                "trl": {k: v for k, v in logs.items() if isinstance(v, int | float)
                        and not _per_harness_key(k)}}
        self.steps.append(line)
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")
        self.console.print(_row(line))
        if self.on_step is not None:
            self.on_step(line)


def _per_harness_key(key: str) -> bool:
    """`harnessrl/<harness>/<figure>`: `report_batch`'s, already in the line's harnesses."""
    return key.startswith("harnessrl/") and key.count("/") == 2


# Per harness, into the trainer's metrics as harnessrl/<harness>/<name> (so report_to
# backends get them, as from the async trainer's worker).
REPORTED = ("reward", "pass_rate", "tool_calls", "turns", "completion_tokens",
            "agent_timeouts", "infra_errors", "chain_extension_rate")


def report_batch(batch: Batch, trainer: Any) -> None:
    """The batch's figures per harness into `trainer`'s metrics of this step."""
    if trainer is None:
        return
    from harnessrl.train.trl_compat import metrics_sink

    sink = metrics_sink(trainer)
    for harness, figures in batch_metrics(batch)["harnesses"].items():
        for name in REPORTED:
            if (value := figures.get(name)) is not None:
                sink[f"harnessrl/{harness}/{name}"].append(float(value))


def _row(line: dict[str, Any]) -> str:
    per = ", ".join(f"{h} {fmt(g['pass_rate'], '.0%')}"
                    for h, g in line.get("harnesses", {}).items())
    return (f"step {line['step']}: reward {fmt(line.get('reward'))} · pass {per or '-'} · "
            f"tool calls {fmt(line.get('tool_calls'), '.1f')} · tokens "
            f"{fmt(line.get('completion_tokens'), '.0f')} · trained tokens "
            f"{line.get('trained_tokens', '-')} · chain ext. "
            f"{fmt(line.get('chain_extension_rate'), '.0%')} · loss "
            f"{fmt(line['trl'].get('loss'))} · sampled with "
            f"{','.join(line.get('sampled_with', [])) or '-'} → now {line['weight_version']}")


def _callback(log: StepLog) -> TrainerCallback:
    from transformers import TrainerCallback

    class MetricsCallback(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **_: Any) -> None:
            # TRL logs once per step (logging_steps=1) and once more with the run's totals;
            # an eval pass is logged through the trainer too (its own metrics line).
            if logs and "train_runtime" not in logs and not is_eval_log(logs):
                log.add(int(state.global_step), logs)

    return MetricsCallback()


# ------------------------------------------------------------------ the run
def resolve_model(spec: str, console: Console) -> Path:
    """The model the config names (any form `model_name.resolve_model` takes)."""
    from harnessrl.train.model_name import resolve_model as resolve

    return Path(resolve(spec, status=console.status))


def train(config: TrainSettings, *, console: Console | None = None,
          on_step: Callable[[dict[str, Any]], None] | None = None,
          resume: str | None = None, callbacks: Sequence[Any] = (),
          on_phase: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run GRPO steps end to end (up to `config.grpo.steps` in all); one metrics dict per
    step. `resume`: "latest" or a checkpoint's path, to go on from;
    `callbacks`: more `TrainerCallback`s for the trainer; `on_phase`: told each phase
    of the async trainer's schedule ("sampling", "training step N", "syncing weights")."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental"
    # TRL names the vLLM versions its own vLLM integration was tested with; harnessrl talks
    # to vLLM itself (through the proxy), so that range does not apply.
    warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions")
    console = console or Console()
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    from harnessrl.harnesses import get
    from harnessrl.rollout.tasks.task import load_tasks

    tasks = load_tasks(config.rollout.tasks)
    harnesses = [get(name) for name in config.rollout.harnesses]
    asynchronous = config.grpo.trainer == "async"
    processes = check_processes(config)
    if processes > 1:
        _refuse_long_run_settings(config, resume, "one trainer process")
    # before anything starts: the eval split, the checkpoint and the config checked
    long = long_run(config, tasks, console, resume, ASYNC if asynchronous else SYNC)
    tasks = list(long.tasks)
    if len(tasks) < config.grpo.tasks_per_step:
        raise ValueError(f"{len(tasks)} tasks, but tasks_per_step is "
                         f"{config.grpo.tasks_per_step}")
    if asynchronous:
        check_config(config)
    else:
        check_sync(config, resume)
    if processes > 1:  # under accelerate launch / torchrun: one rollout worker, on rank 0
        state = process_state()
        with state.main_process_first():  # the first builds the model, the others read it
            model_dir = resolve_model(config.model.path, console)
        if not state.is_main_process:
            train_async_rank(config, tasks, model_dir)
            return []
    else:
        model_dir = resolve_model(config.model.path, console)
    with policy_engines(config, model_dir, run_dir, status=console.status) as engines:
        if asynchronous:
            return train_async(config, tasks, harnesses, model_dir, engines, run_dir,
                               console, on_step, long=long, callbacks=callbacks,
                               on_phase=on_phase)
        return _train(config, tasks, harnesses, model_dir, engines, run_dir, console, on_step,
                      long, callbacks)


class SyncSeam:
    """What a checkpoint records of the sync trainer (`long_run.Seam`): the groups TRL's
    sampler has handed out (one generation per optimizer step, `check_sync`; TRL's resume
    skips them itself) and the step whose weights the rollout function synced."""

    def cursor(self, trainer: Any) -> int:
        a = trainer.args
        rows = a.per_device_train_batch_size * a.gradient_accumulation_steps * a.world_size
        return int(trainer.state.global_step) * rows // int(trainer.num_generations)

    def weight_version(self, trainer: Any) -> int:
        return trainer.rollout_func.synced_step


SYNC = SyncSeam()


def check_sync(config: TrainSettings, resume: str | None = None) -> None:
    """What the sync trainer (TRL's GRPOTrainer, one row per rollout, its own advantage)
    cannot do: a penalty row, the shuffled control, and (with checkpoints or a resume) a
    generation that spans optimizer steps: TRL's checkpoint does not hold its buffered
    rows, so a resume would lose them."""
    g = config.grpo
    if config.checkpoint.every_steps or resume is not None:
        trl = g.trl
        if (trl.get("num_iterations", 1) != 1 or trl.get("steps_per_generation") not in
                (None, trl.get("gradient_accumulation_steps", 1))):
            raise ValueError("grpo.trl.num_iterations / steps_per_generation: a generation "
                             "spanning optimizer steps cannot be checkpointed (TRL's "
                             "checkpoint does not hold its buffered rows)")
    for name in ("rejected_turns", "truncated_turns"):
        if getattr(g, name) == "penalty":
            raise ValueError(f'grpo.{name} = "penalty" gives the replies a row of their own: '
                             'grpo.trainer = "async" only ("mask" or "train" here)')
    if g.advantage_control != "none":
        raise ValueError('grpo.advantage_control: TRL\'s sync trainer computes its own '
                         'advantages; use grpo.trainer = "async"')


def _refuse_long_run_settings(config: TrainSettings, resume: str | None, needed: str) -> None:
    named = [name for name, on in (("--resume", resume is not None),
                                   ("[checkpoint] every_steps", config.checkpoint.every_steps),
                                   ("[eval] every_steps", config.eval.every_steps)) if on]
    if named:
        raise ValueError(f"{', '.join(named)}: with {needed} only, for now")


def _train(config: TrainSettings, tasks: list[Task], harnesses: list[Harness], model_dir: Path,
           engines: PolicyEngines, run_dir: Path, console: Console,
           on_step: Callable[[dict[str, Any]], None] | None, long: LongRun,
           callbacks: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """TRL's GRPOTrainer with `HarnessRollouts` as its rollout function; `long`: its
    checkpoints, resume and eval (train.runs.long_run)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    from trl import GRPOTrainer

    from harnessrl.train.common import guarded_trainer
    from harnessrl.train.trl import HarnessRollouts, harness_reward

    hf_logging.disable_progress_bar()  # loading and saving bars would tear the live view
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir,
                                                 dtype=getattr(torch, trainer_dtype(config)))
    sync = engines.weight_sync(run_dir / "weights", allow_tied=config.model.allow_tied)
    progress = _progress()
    task_id = progress.add_task("rollouts", total=None, step=0)
    rollouts = HarnessRollouts(
        tasks=tasks, harnesses=harnesses, engine=engines.engine,
        run_dir=run_dir,
        pad_token_id=tokenizer.pad_token_id, sync=sync, sampling=sampling_of(config),
        shaping=config.shaping, mix=config.rollout.mix, settings=config.rollout,
        train_retried=config.grpo.train_retried,
        on_outcome=lambda _o: progress.advance(task_id), cluster=config.cluster,
        engine_factory=node_engines(config, engines), rows=row_settings(config),
        # the harness rotation goes on where the resumed step is (one call per step)
        rotation=long.resumed_step, on_batch=report_batch)
    log = StepLog(run_dir / METRICS_FILE, rollouts, progress.console, on_step)
    with rollouts, progress:
        long.on_worker_start(rollouts)
        trainer = long.trainer_class(guarded_trainer(GRPOTrainer))(
            model=model, reward_funcs=[harness_reward], args=grpo_config(config, run_dir),
            train_dataset=Dataset.from_dict({"prompt": [t.id for t in tasks]}),
            processing_class=tokenizer, rollout_func=rollouts,
            # the weight sync's step end before the eval's: a pass samples the new weights
            callbacks=[rollouts.callback(), _callback(log), long.callback(), *callbacks])
        quiet(trainer)
        trainer.train(resume_from_checkpoint=long.resume_from)
    model = long.finish(trainer)
    console.print(summary_table(log.steps))
    console.print(f"metrics: {run_dir / METRICS_FILE} · store: {run_dir / 'trace.db'} · "
                  f"model: {model}")
    return log.steps


def grpo_config(config: TrainSettings, run_dir: Path) -> GRPOConfig:
    import torch
    from trl import GRPOConfig

    g = config.grpo
    values: dict[str, Any] = dict(
        output_dir=str(run_dir / "trainer"), max_steps=g.steps,
        per_device_train_batch_size=g.tasks_per_step * g.num_generations,
        num_generations=g.num_generations, learning_rate=g.learning_rate, beta=g.beta,
        scale_rewards=g.scale_rewards,
        temperature=config.engine.temperature,
        seed=g.seed, use_cpu=not torch.cuda.is_available(),
        bf16=trainer_dtype(config) == "bfloat16",
        report_to=g.report_to or "none",
        logging_steps=1, dataloader_num_workers=0,
        disable_tqdm=True,  # our own progress shows rollouts and steps
        # checkpoints are harnessrl's (train.runs.checkpoint), at TRL's save points
        **saving(config.checkpoint.every_steps))
    return GRPOConfig(**{**values, **g.trl})


def _progress() -> Progress:
    return Progress(TextColumn("[bold]rollouts"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn())


def summary_table(steps: list[dict[str, Any]]) -> Table:
    table = Table("step", "reward", "pass rate", "infra", "tool calls", "tokens",
                  "trained tokens", "chain ext.", "loss", "sampled with", "now serving",
                  title="GRPO steps")
    for s in steps:
        table.add_row(str(s["step"]), fmt(s.get("reward")), fmt(s.get("pass_rate"), ".0%"),
                      str(s.get("infra_errors", "-")), fmt(s.get("tool_calls"), ".1f"),
                      fmt(s.get("completion_tokens"), ".0f"), str(s.get("trained_tokens", "-")),
                      fmt(s.get("chain_extension_rate"), ".0%"), fmt(s["trl"].get("loss")),
                      ",".join(s.get("sampled_with", [])) or "-", str(s.get("weight_version")))
    return table
