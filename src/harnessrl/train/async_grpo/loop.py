"""`harnessrl train` with `grpo.trainer = "async"`: TRL's `AsyncGRPOTrainer` fed by
`HarnessRolloutWorker`, weights to vLLM by `FileWeightTransfer`.

One line per optimizer step in `metrics.jsonl`, built from what the trainer logs (TRL's
own numbers and the worker's, which reach TRL's `report_to` backends the same way): reward,
rows per rollout, sampled tokens trained / captured with all chains and with the main
chain only (overall and per harness), rows dropped as stale (here and in TRL's queue),
staleness at enqueue, the trainer's idle share (time waiting for rows / step time), the
version vLLM serves, and the schedule's figures (train.async_grpo.schedule; cumulative): seconds per
phase, rollouts sampled and trained, the trainer's tokens/s in its step.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from harnessrl.train.common import (
    METRICS_FILE,
    NO_GRADIENT,
    fmt,
    quiet,
    row_settings,
    sampling_of,
)
from harnessrl.train.config import TrainSettings
from harnessrl.train.engines import PolicyEngines
from harnessrl.train.runs.long_run import LongRun, is_eval_log, saving

if TYPE_CHECKING:
    from transformers import TrainerCallback

    from harnessrl.harnesses.base import Harness
    from harnessrl.rollout.tasks.task import Task
    from harnessrl.train.async_grpo.schedule import Schedule
    from harnessrl.train.async_grpo.transfer import VersionedTransfer
    from harnessrl.train.async_grpo.worker import HarnessRolloutWorker
    from harnessrl.train.rows.importance import Importance
    from harnessrl.train.weights import VLLMWeightSync

_SHARES = ("rows_per_rollout", "tokens_trained_share", "tokens_main_chain_share")
# per harness, also through report_to: the worker's rates (train.async_grpo.groups.OUTCOME_RATES)
_PER_HARNESS = (*_SHARES, "reward", "pass_rate", "tool_calls", "turns", "completion_tokens",
                "agent_timeouts", "infra_errors_total")


def check_config(config: TrainSettings) -> None:
    """Refuses, before anything starts, what `AsyncGRPOTrainer` cannot do as asked."""
    if config.grpo.beta:
        raise ValueError('grpo.beta: AsyncGRPOTrainer has no KL term; use trainer = "sync"')
    check_transfer(config)
    import dataclasses

    from harnessrl.train.trl_compat import async_trl

    known = {f.name for f in dataclasses.fields(async_trl().config)}
    if unknown := sorted(set(config.grpo.trl) - known):
        raise ValueError(f"grpo.trl: {unknown} are not AsyncGRPOConfig fields "
                         "(grpo.trainer = \"async\")")
    check_whole_groups(config.grpo.trl)


def check_whole_groups(trl: dict[str, Any]) -> None:
    """A step is `tasks_per_step` whole groups in one micro-batch (train.async_grpo.batches):
    TRL's settings that would batch rows otherwise are refused."""
    if trl.get("gradient_accumulation_steps", 1) != 1:
        raise ValueError("grpo.trl.gradient_accumulation_steps: a step is tasks_per_step "
                         "whole groups in one micro-batch; set grpo.tasks_per_step instead")
    if trl.get("token_budget", 0):
        raise ValueError("grpo.trl.token_budget: rows are batched by whole groups "
                         "(grpo.tasks_per_step), not by a token budget")


def check_transfer(config: TrainSettings) -> None:
    """TRL's NCCL transfer reaches one vLLM server, on GPUs, started to receive it."""
    if config.grpo.weight_transfer != "trl":
        return
    several = len(config.engine.roots) > 1 or config.engine.servers > 1
    if several:
        raise ValueError('grpo.weight_transfer = "trl": TRL\'s NCCL transfer reaches one '
                         'vLLM server; with several (engine.urls/servers) use "file"')
    import torch

    if not torch.cuda.is_available():
        raise ValueError('grpo.weight_transfer = "trl" streams the weights over NCCL, which '
                         'needs CUDA; on a CPU use "file"')


def async_config(config: TrainSettings, run_dir: Path, vllm_url: str) -> Any:
    """TRL's `AsyncGRPOConfig` from ours."""
    import torch

    from harnessrl.train.async_grpo.processes import processes
    from harnessrl.train.config import trainer_dtype
    from harnessrl.train.trl_compat import async_trl

    check_config(config)
    g = config.grpo
    values: dict[str, Any] = dict(
        output_dir=str(run_dir / "trainer"), max_steps=g.steps,
        # a step's rows, spread evenly over the trainer's processes (check_processes)
        per_device_train_batch_size=g.tasks_per_step * g.num_generations // processes(),
        num_generations=g.num_generations, learning_rate=g.learning_rate,
        temperature=config.engine.temperature, max_staleness=g.max_staleness,
        max_inflight_tasks=g.max_inflight, seed=g.seed, use_cpu=not torch.cuda.is_available(),
        bf16=trainer_dtype(config) == "bfloat16", dtype=trainer_dtype(config),
        report_to=g.report_to or "none", logging_steps=1,
        token_budget=0, vllm_server_base_url=vllm_url, disable_tqdm=True,
        # checkpoints are harnessrl's (train.runs.checkpoint), at TRL's save points
        **saving(config.checkpoint.every_steps), **_colocated_queue(config))
    return async_trl().config(**{**values, **g.trl})


def importance_of(config: TrainSettings) -> Importance | None:
    """The importance-sampling correction `[grpo]` asks for; "auto" turns it on unless
    both sides compute in float32."""
    from harnessrl.train.config import trainer_dtype
    from harnessrl.train.rows.importance import Importance

    g = config.grpo
    dtypes = {trainer_dtype(config), str(g.trl.get("dtype", trainer_dtype(config)))}
    on = g.importance == "on" or (g.importance == "auto" and dtypes != {"float32"})
    if not on or (g.importance_cap is None and g.importance_band is None):
        return None
    return Importance(cap=g.importance_cap, band=g.importance_band)


def _colocated_queue(config: TrainSettings) -> dict[str, Any]:
    """Colocated (train.async_grpo.schedule), the sampler runs one step's groups ahead, no more
    (the worker's queue holds whole groups)."""
    from harnessrl.train.async_grpo.schedule import is_colocated

    if not is_colocated(config.schedule, config.engine.roots, config.cluster is not None):
        return {}
    return {"queue_maxsize": config.grpo.tasks_per_step}


class AsyncSeam:
    """What a checkpoint records of the async trainer (`long_run.Seam`): its rollout
    worker's cursor in the run's task order and TRL's model version."""

    def cursor(self, trainer: Any) -> int:
        worker = trainer.rollout_worker  # TRL's, given to the trainer's constructor
        if worker is None:
            raise RuntimeError("a checkpoint of a trainer without a rollout worker")
        return int(worker.cursor)

    def weight_version(self, trainer: Any) -> int:
        return int(trainer.model_version)


ASYNC = AsyncSeam()


def step_line(step: int, logs: dict[str, Any], served: str | None) -> dict[str, Any]:
    """The metrics line of one optimizer step, from the trainer's log of it."""
    def get(key: str) -> Any:
        return logs.get(key)

    harnesses = sorted({k.split("/")[1] for k in logs
                        if k.startswith("harnessrl/") and k.count("/") == 2})
    wait, step_s = get("perf/rollout_wait_s"), get("perf/step_s")
    return {
        "step": step, "trainer": "async", "reward": get("reward"),
        **{name: get(f"harnessrl/{name}") for name in _SHARES},
        "stale_dropped": int((get("sample/dropped_stale_total") or 0)
                             + (get("harnessrl/rows_stale_dropped_total") or 0)),
        "staleness": {k.split("_")[1]: v for k, v in logs.items()
                      if k.startswith("harnessrl/staleness_")},
        "infra_errors": get("harnessrl/infra_errors_total"),
        **diagnostics(logs),
        "trainer_idle_share": wait / step_s if wait is not None and step_s else None,
        "harnesses": {h: {name: get(f"harnessrl/{h}/{name}") for name in _PER_HARNESS}
                      for h in harnesses},
        "weight_version": served,
        "trl": {k: v for k, v in logs.items()
                if isinstance(v, int | float) and not k.startswith("harnessrl/")},
    }


# A step's diagnostics (docs/guides/async-grpo.md): name in metrics.jsonl -> trainer log key.
# The worker's are over the groups that finished since the last step; the trainer's over
# the step's batch.
DIAGNOSTICS = {
    "groups_with_spread": "harnessrl/groups_with_spread",  # share of finished groups
    "advantage_abs": "harnessrl/advantage_abs",  # mean |advantage| of scored rollouts
    "advantage_range": "harnessrl/advantage_range",  # max - min in a group, mean
    "kl": "kl",  # to the sampler: mean of (r - 1) - log r, r = policy / engine prob
    "clip_fraction": "clip_ratio/region_mean",
    # importance sampling against the engine's logprobs (None: off)
    "kl_to_sampler": "harnessrl/kl_to_sampler",
    "is_masked_fraction": "harnessrl/is_masked_fraction",
    "is_capped_fraction": "harnessrl/is_capped_fraction",
    "is_ratio_mean": "harnessrl/is_ratio_mean", "is_ratio_max": "harnessrl/is_ratio_max",
    "rejected_share": "harnessrl/replies_rejected",  # of the finished rollouts' replies
    "truncated_share": "harnessrl/replies_truncated",
    "step_groups": "harnessrl/step_groups", "step_rows": "harnessrl/step_rows",
    "step_trained_tokens": "harnessrl/step_trained_tokens",
}
_COUNTS = {  # summed: stale groups are dropped by the worker or in the trainer's queue
    "groups_uniform": ("harnessrl/groups_uniform_total",),
    "groups_stale_dropped": ("harnessrl/groups_stale_total",
                             "harnessrl/groups_stale_dropped_total"),
    "agent_timeouts": ("harnessrl/agent_timeouts_total",),
    "no_gradient": (NO_GRADIENT,),
}


def diagnostics(logs: dict[str, Any]) -> dict[str, Any]:
    """Whether the step had a signal, and what it held (None: not logged this step)."""
    return {**{name: logs.get(key) for name, key in DIAGNOSTICS.items()},
            **{name: int(sum(logs.get(k) or 0 for k in keys))
               for name, keys in _COUNTS.items()}}


def _row(line: dict[str, Any]) -> str:
    return (f"step {line['step']}: reward {fmt(line['reward'])} · rows/rollout "
            f"{fmt(line['rows_per_rollout'], '.2f')} · sampled tokens trained "
            f"{fmt(line['tokens_trained_share'], '.0%')} (main chain only "
            f"{fmt(line['tokens_main_chain_share'], '.0%')}) · stale dropped "
            f"{line['stale_dropped']} · trainer idle {fmt(line['trainer_idle_share'], '.0%')}"
            f" · groups with spread {fmt(line.get('groups_with_spread'), '.0%')}"
            f"{' (no gradient: not stepped)' if line.get('no_gradient') else ''}"
            f" · loss {fmt(line['trl'].get('loss'))} → now {line['weight_version']}")


def _callback(path: Path, sync: VLLMWeightSync, console: Console, steps: list[dict[str, Any]],
              on_step: Callable[[dict[str, Any]], None] | None,
              schedule: Schedule, worker: HarnessRolloutWorker) -> TrainerCallback:
    from transformers import TrainerCallback

    from harnessrl.train.async_grpo.schedule import figures

    class AsyncStepLog(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any,
                   logs: dict[str, Any] | None = None, **_: Any) -> None:
            if (not logs or "train_runtime" in logs or not state.is_world_process_zero
                    or is_eval_log(logs)):
                return
            line = step_line(int(state.global_step), logs, sync.agreed_version())
            line["schedule"] = figures(schedule, worker.stats, len(worker.trained_rollouts),
                                       logs)
            steps.append(line)
            with path.open("a") as f:
                f.write(json.dumps(line) + "\n")
            console.print(_row(line))
            if on_step is not None:
                on_step(line)

    return AsyncStepLog()


def train_async(config: TrainSettings, tasks: list[Task], harnesses: list[Harness],
                model_dir: Path,
                engines: PolicyEngines, run_dir: Path, console: Console,
                on_step: Callable[[dict[str, Any]], None] | None, *,
                long: LongRun | None = None, callbacks: Sequence[Any] = (),
                on_phase: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The main process: vLLM, the proxy (or the cluster's shards), the rollout worker and
    rank 0 of the trainer. `long`: its checkpoints, resume and eval (train.runs.long_run).
    Each part is built whole by its constructor from the ones before it: the weight sync,
    the transfer, the worker, the trainer."""
    from harnessrl.train.async_grpo.schedule import callback as schedule_callback
    from harnessrl.train.async_grpo.schedule import scheduled
    from harnessrl.train.async_grpo.schedule import summary as schedule_summary

    tokenizer = _prepare(model_dir)
    args = async_config(config, run_dir, engines.url)  # refuses bad keys before any start
    # every server reloads (the proxies' gates held) before the new version is released
    sync = engines.weight_sync(run_dir / "weights", allow_tied=config.model.allow_tied)
    long = long or LongRun(config, run_dir, tasks, console, run_dir / METRICS_FILE, ASYNC)
    # a resumed run's versions go on above every one used before its crash
    version = long.first_version(_served(sync))
    transfer = _transfer(config, sync, model_dir, version)
    status = console.status("async GRPO: rollouts in flight while the trainer steps")
    schedule = _schedule(config, engines, args, status, on_phase)
    worker = _worker(config, tasks, harnesses, engines, run_dir, tokenizer, args, long,
                     schedule, transfer, version)
    if config.cluster is not None:
        with console.status("placing the rollout nodes on Ray"):
            worker.open()  # a cluster that can run no rollout is refused here
    steps: list[dict[str, Any]] = []
    trainer = _trainer(config, tasks, model_dir, args, tokenizer, worker, transfer,
                       [_callback(run_dir / METRICS_FILE, sync, console, steps, on_step,
                                  schedule, worker), long.callback(), *callbacks],
                       lambda cls: scheduled(long.trainer_class(
                           versioned(cls, transfer, version)), schedule))
    # after TRL's own callbacks: its step end (the weight sync) comes first
    trainer.add_callback(schedule_callback(schedule))
    _run(config, trainer, worker, long, status, console)
    if steps:
        console.print(schedule_summary(steps[-1]["schedule"]))
    model = long.finish(trainer)
    console.print(f"metrics: {run_dir / METRICS_FILE} · store: {run_dir / 'trace.db'} · "
                  f"model: {model}")
    return steps


def _run(config: TrainSettings, trainer: Any, worker: HarnessRolloutWorker, long: LongRun,
         status: Any, console: Console) -> None:
    """Train to the end (from a checkpoint when resuming); the worker stops either way."""
    if config.lora is not None:  # what trains, and that the sync sends merged weights
        from harnessrl.train.lora import attach_metrics, describe

        console.print(describe(config.lora, trainer.model))
        attach_metrics(trainer, config.lora)
    try:
        with status:
            trainer.train(resume_from_checkpoint=long.resume_from)
    finally:
        worker.stop()


def _transfer(config: TrainSettings, sync: VLLMWeightSync, model_dir: Path,
              version: int) -> VersionedTransfer:
    """How the weights reach vLLM, every swap named `v<n>` above `version`: by file, or by
    TRL's NCCL client, which the trainer builds and hands to it (`versioned`)."""
    from harnessrl.train.async_grpo.transfer import FileWeightTransfer, VersionedTransfer

    if config.grpo.weight_transfer == "file":
        return FileWeightTransfer(sync, model_dir, version=version)
    return VersionedTransfer(None, sync, version=version)


def versioned(base: type, transfer: VersionedTransfer, version: int) -> type:
    """`base` (TRL's async trainer) built with `transfer` as its weight transfer and its
    version counter at `version`. A `transfer` with no inner one takes the client TRL builds
    itself from the model (its NCCL `WeightTransferClient`): TRL names no version, so
    without the wrapper every row would be untagged."""

    class Versioned(base):  # type: ignore[valid-type, misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            own = transfer.inner is None  # TRL builds the transfer
            super().__init__(*args, **{**kwargs, "weight_transfer": None if own else transfer})
            if own:
                transfer.inner, self.weight_transfer = self.weight_transfer, transfer
            self.model_version = version

    return Versioned


def _worker(config: TrainSettings, tasks: list[Task], harnesses: list[Harness],
            engines: PolicyEngines, run_dir: Path, tokenizer: Any, args: Any, long: LongRun,
            schedule: Schedule, transfer: VersionedTransfer, version: int
            ) -> HarnessRolloutWorker:
    """The rollout worker over the run's proxy (or cluster), from the task cursor and
    weight version a resumed run goes on from."""
    from harnessrl.train.async_grpo.worker import HarnessRolloutWorker
    from harnessrl.train.engines import node_engines
    from harnessrl.train.trl import HarnessRollouts

    rollouts = HarnessRollouts(
        tasks=tasks, harnesses=harnesses, engine=engines.engine, run_dir=run_dir,
        pad_token_id=tokenizer.pad_token_id, sampling=sampling_of(config),
        shaping=config.shaping, mix=config.rollout.mix, settings=config.rollout,
        train_retried=config.grpo.train_retried,
        cluster=config.cluster, engine_factory=node_engines(config, engines))
    g = config.grpo
    return HarnessRolloutWorker(rollouts, num_generations=g.num_generations,
                                max_inflight=g.max_inflight, max_staleness=g.max_staleness,
                                transfer=transfer, settings=row_settings(config),
                                drop_uniform=g.drop_uniform_groups,
                                # TRL's own queue bound (grpo.trl), here in whole groups:
                                # the sampler runs at most that far ahead
                                queue_maxsize=args.queue_maxsize,
                                call_kinds=tuple(g.call_kinds), order=long.order,
                                first_group=long.first_group, first_version=version,
                                on_start=long.on_worker_start, schedule=schedule)


def _schedule(config: TrainSettings, engines: PolicyEngines, args: Any, status: Any,
              on_phase: Callable[[str], None] | None) -> Schedule:
    """The run's schedule; its phase shown on the status line and given to `on_phase`."""
    from harnessrl.train.async_grpo.schedule import for_run

    def shown(phase: str) -> None:
        status.update(f"async GRPO: {phase}")
        if on_phase is not None:
            on_phase(phase)

    g = config.grpo
    return for_run(config.schedule, engine_roots=config.engine.roots,
                   clustered=config.cluster is not None, served=engines.urls,
                   step_groups=g.tasks_per_step, steps=g.steps,
                   on_phase=shown)


def train_async_rank(config: TrainSettings, tasks: list[Task], model_dir: Path) -> None:
    """A process of a multi-process trainer other than the main one: no vLLM, no proxy,
    no rollouts; TRL hands it its share of every batch and gathers the weights on the
    main process for the transfer."""
    tokenizer = _prepare(model_dir)
    args = async_config(config, Path(config.run_dir), _UNUSED_URL)
    _trainer(config, tasks, model_dir, args, tokenizer, None, None, []).train()


_UNUSED_URL = "http://127.0.0.1:9"  # TRL talks to vLLM from the main process only


def _prepare(model_dir: Path) -> Any:
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from harnessrl.train.async_grpo.transfer import install_cpu_support

    hf_logging.disable_progress_bar()
    _quiet_second_interval_callback()
    install_cpu_support()
    return AutoTokenizer.from_pretrained(model_dir)


def _trainer(config: TrainSettings, tasks: list[Task], model_dir: Path, args: Any,
             tokenizer: Any, worker: HarnessRolloutWorker | None,
             transfer: VersionedTransfer | None, callbacks: list[Any],
             wrap: Callable[[type], type] = lambda cls: cls) -> Any:
    """TRL's trainer, or `wrap`'s subclass of it (one whose checkpoints are harnessrl's);
    Any: the class is looked up where the installed TRL keeps it (`trl_compat`)."""
    from datasets import Dataset

    from harnessrl.train.async_grpo.batches import group_trainer
    from harnessrl.train.lora import trainer_kwargs
    from harnessrl.train.trl_compat import async_trl

    trainer = wrap(group_trainer(async_trl().trainer, groups_per_step=config.grpo.tasks_per_step,
                                 scale=config.grpo.scale_rewards,
                                 importance=importance_of(config)))(
        model=str(model_dir), args=args, rollout_worker=worker, weight_transfer=transfer,
        train_dataset=Dataset.from_dict({"prompt": [t.id for t in tasks]}),
        processing_class=tokenizer, callbacks=callbacks, **trainer_kwargs(config.lora))
    quiet(trainer)
    return trainer


def _served(sync: VLLMWeightSync) -> str | None:
    """The version vLLM serves now, if every server agrees on one."""
    from harnessrl.train.weights import WeightSyncError

    try:
        return sync.agreed_version()
    except WeightSyncError:
        return None


def _quiet_second_interval_callback() -> None:
    """TRL adds two `StepIntervalCallback`s (weight sync, step metrics) on purpose, and
    transformers warns about the second with the whole callback list: a screenful per run
    that says nothing. Only that warning is dropped."""
    import logging

    def keep(record: logging.LogRecord) -> bool:
        return "StepIntervalCallback" not in record.getMessage()

    logging.getLogger("transformers.trainer_callback").addFilter(keep)

