"""`harnessrl train` with `grpo.trainer = "async"`: TRL's `AsyncGRPOTrainer` fed by
`HarnessRolloutWorker`, weights to vLLM by `FileWeightTransfer`.

One line per optimizer step in `metrics.jsonl`, built from what the trainer logs (TRL's
own numbers and the worker's, which reach TRL's `report_to` backends the same way): reward,
rows per rollout, sampled tokens trained / captured with all chains and with the main
chain only (overall and per harness), rows dropped as stale (here and in TRL's queue),
staleness at enqueue, the trainer's idle share (time waiting for rows / step time), and
the version vLLM serves.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from harnessrl.train.config import TrainConfig, shaping_of
from harnessrl.train.engines import PolicyEngines

METRICS_FILE = "metrics.jsonl"
_SHARES = ("rows_per_rollout", "tokens_trained_share", "tokens_main_chain_share")


def check_config(config: TrainConfig) -> None:
    """Refuses, before anything starts, what `AsyncGRPOTrainer` cannot do as asked."""
    if config.cluster is not None:
        # The weight gate that holds new calls during a swap lives in this process's proxy;
        # the shards' proxies on other nodes have no such gate yet.
        raise ValueError('[cluster] trains with grpo.trainer = "sync" only, for now')
    if config.grpo.beta:
        raise ValueError('grpo.beta: AsyncGRPOTrainer has no KL term; use trainer = "sync"')
    import dataclasses

    from trl.experimental.async_grpo import AsyncGRPOConfig

    known = {f.name for f in dataclasses.fields(AsyncGRPOConfig)}
    if unknown := sorted(set(config.grpo.trl) - known):
        raise ValueError(f"grpo.trl: {unknown} are not AsyncGRPOConfig fields "
                         "(grpo.trainer = \"async\")")


def async_config(config: TrainConfig, run_dir: Path, vllm_url: str) -> Any:
    """TRL's `AsyncGRPOConfig` from ours."""
    import torch
    from trl.experimental.async_grpo import AsyncGRPOConfig

    check_config(config)
    g = config.grpo
    values: dict[str, Any] = dict(
        output_dir=str(run_dir / "trainer"), max_steps=g.steps,
        per_device_train_batch_size=g.tasks_per_step * g.num_generations,
        num_generations=g.num_generations, learning_rate=g.learning_rate,
        temperature=config.engine.temperature, max_staleness=g.max_staleness,
        max_inflight_tasks=g.max_inflight, seed=g.seed, use_cpu=not torch.cuda.is_available(),
        bf16=False, dtype=config.engine.dtype, report_to=g.report_to or "none", logging_steps=1,
        save_strategy="no", token_budget=0, vllm_server_base_url=vllm_url, disable_tqdm=True)
    return AsyncGRPOConfig(**{**values, **g.trl})


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
        "trainer_idle_share": wait / step_s if wait is not None and step_s else None,
        "harnesses": {h: {name: get(f"harnessrl/{h}/{name}") for name in _SHARES}
                      for h in harnesses},
        "weight_version": served,
        "trl": {k: v for k, v in logs.items()
                if isinstance(v, int | float) and not k.startswith("harnessrl/")},
    }


def _row(line: dict[str, Any]) -> str:
    def fmt(value: Any, spec: str = ".3f") -> str:
        return "-" if value is None else format(value, spec)
    return (f"step {line['step']}: reward {fmt(line['reward'])} · rows/rollout "
            f"{fmt(line['rows_per_rollout'], '.2f')} · sampled tokens trained "
            f"{fmt(line['tokens_trained_share'], '.0%')} (main chain only "
            f"{fmt(line['tokens_main_chain_share'], '.0%')}) · stale dropped "
            f"{line['stale_dropped']} · trainer idle {fmt(line['trainer_idle_share'], '.0%')}"
            f" · loss {fmt(line['trl'].get('loss'))} → now {line['weight_version']}")


def _callback(path: Path, sync: Any, console: Console, steps: list[dict[str, Any]],
              on_step: Callable[[dict[str, Any]], None] | None) -> Any:
    from transformers import TrainerCallback

    class AsyncStepLog(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any,
                   logs: dict[str, Any] | None = None, **_: Any) -> None:
            if not logs or "train_runtime" in logs:
                return
            line = step_line(int(state.global_step), logs, sync.agreed_version())
            steps.append(line)
            with path.open("a") as f:
                f.write(json.dumps(line) + "\n")
            console.print(_row(line))
            if on_step is not None:
                on_step(line)

    return AsyncStepLog()


def train_async(config: TrainConfig, tasks: list[Any], harnesses: list[Any], model_dir: Path,
                engines: PolicyEngines, run_dir: Path, console: Console,
                on_step: Callable[[dict[str, Any]], None] | None) -> list[dict[str, Any]]:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from harnessrl.train.async_grpo import HarnessRolloutWorker
    from harnessrl.train.async_weights import FileWeightTransfer, install_cpu_support
    from harnessrl.train.loop import _quiet, sampling_of
    from harnessrl.train.trl import HarnessRollouts

    hf_logging.disable_progress_bar()
    _quiet_second_interval_callback()
    install_cpu_support()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    args = async_config(config, run_dir, engines.url)  # refuses bad keys before any start
    # every server reloads (the proxy's gate held) before the new version is released
    sync = engines.weight_sync(run_dir / "weights", allow_tied=config.model.allow_tied)
    transfer = FileWeightTransfer(sync, model_dir)
    rollouts = HarnessRollouts(
        tasks=tasks, harnesses=harnesses, engine=engines.engine, run_dir=run_dir,
        pad_token_id=tokenizer.pad_token_id, sampling=sampling_of(config),
        shaping=shaping_of(config.shaping), mix=config.rollout.mix, settings=config.rollout)
    g = config.grpo
    worker = HarnessRolloutWorker(rollouts, num_generations=g.num_generations,
                                  max_inflight=g.max_inflight, max_staleness=g.max_staleness,
                                  transfer=transfer)
    steps: list[dict[str, Any]] = []
    trainer = AsyncGRPOTrainer(
        model=str(model_dir), args=args, rollout_worker=worker, weight_transfer=transfer,
        train_dataset=Dataset.from_dict({"prompt": [t.id for t in tasks]}),
        processing_class=tokenizer,
        callbacks=[_callback(run_dir / METRICS_FILE, sync, console, steps, on_step)])
    _quiet(trainer)
    with console.status("async GRPO: rollouts in flight while the trainer steps"):
        trainer.train()
    console.print(f"metrics: {run_dir / METRICS_FILE} · store: {run_dir / 'trace.db'}")
    return steps


def _quiet_second_interval_callback() -> None:
    """TRL adds two `StepIntervalCallback`s (weight sync, step metrics) on purpose, and
    transformers warns about the second with the whole callback list: a screenful per run
    that says nothing. Only that warning is dropped."""
    import logging

    def keep(record: logging.LogRecord) -> bool:
        return "StepIntervalCallback" not in record.getMessage()

    logging.getLogger("transformers.trainer_callback").addFilter(keep)

