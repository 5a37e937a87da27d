#!/usr/bin/env python3
"""What a long run's checkpoints and eval passes cost against a training step, on this box.

1. **A real async run** (`harnessrl train`'s own code: TRL's async trainer, real vLLM
   serving the tiny model, the scripted agent of tests/long_run_agent.py as the harness):
   `--steps` steps, a checkpoint every `--every` steps, an eval pass every `--eval-every`.
   Per checkpoint its time (written, sealed with sha256, renamed, RUN_DIR/model linked)
   and size; per step TRL's own step time (`perf/step_s`, rollout waits included); per
   eval pass its time. Ratios against the median step.
2. **SmolLM2-135M** (no vLLM): one optimizer step of TRL's trainer class's base (a
   `transformers.Trainer`, AdamW, float32, 2 x 512 tokens, forward + backward + step)
   against one harnessrl checkpoint of the same trainer (model, optimizer, RNG, state).

Figures only; nothing is asserted. Run under the heavy lock:

    flock /tmp/harnessrl-heavy.lock .venv/bin/python bench/train/long_runs.py [--steps 6]
        [--every 2] [--eval-every 3] [--skip-smollm2] [--out bench/long_runs.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests.long_run_agent

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TASKS = [{"id": f"t{i}", "instruction": f"Finish job {i}", "verify": ["test -f done.txt"],
          "timeout": 120} for i in range(6)]


def _timed_saves(records: list[dict[str, Any]]) -> Any:
    """Times every checkpoint of the run into `records`; returns the untimed `save`."""
    from harnessrl.train.runs import checkpoint

    real = checkpoint.save

    def save(trainer: Any, root: Path, state: dict[str, Any], keep: int) -> Path:
        started = time.monotonic()
        path = real(trainer, root, state, keep)
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        records.append({"step": trainer.state.global_step, "seconds":
                        time.monotonic() - started, "bytes": size})
        return path

    checkpoint.save = save  # type: ignore[assignment]
    return real


def real_run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from rich.console import Console
    from tests import long_run_agent
    from tests.helpers import train_toml

    import harnessrl.harnesses as registry
    from harnessrl.models.tiny import build_tiny_model
    from harnessrl.proxy.engines.vllm_server import VLLMServer
    from harnessrl.train.config import load_config
    from harnessrl.train.loop import train

    known = registry.get
    registry.get = lambda n: long_run_agent.harness(n) if n.startswith("agent-") else known(n)
    work.mkdir(parents=True, exist_ok=True)
    model = build_tiny_model(Path("~/.cache/harnessrl/models/tiny-qwen2").expanduser())
    tasks = work / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps(t) for t in TASKS))
    saves: list[dict[str, Any]] = []
    real_save = _timed_saves(saves)
    with VLLMServer(model=str(model), served_name="tiny", dtype="float32",
                    max_model_len=4096, extra_args=["--seed", "0"],
                    log_path=work / "vllm.log") as server:
        config = train_toml(
            work / "train.toml", run_dir=work / "run", model=model, url=f"{server.url}/v1",
            max_tokens=8, harnesses=["agent-chat"], tasks=tasks,
            grpo={"steps": args.steps, "num_generations": 2, "tasks_per_step": 1,
                  "max_inflight": 2, "max_staleness": 8, "learning_rate": 1e-3},
            checkpoint={"every_steps": args.every},
            eval={"every_steps": args.eval_every, "holdout": 0.34,
                  "harnesses": ["agent-chat", "agent-fresh"]})
        try:
            train(load_config(config), console=Console(file=open(os.devnull, "w")))  # noqa: SIM115
        finally:
            from harnessrl.train.runs import checkpoint

            checkpoint.save = real_save  # part 2 times its own save
    lines = [json.loads(x) for x in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [x["trl"].get("perf/step_s") for x in lines if "eval" not in x]
    return {"step_s": [s for s in steps if s is not None], "saves": saves,
            "evals": [(x["step"], x["eval_seconds"], sum(
                r["rollouts"] + r["infra_errors"] for r in x["eval"].values()))
                for x in lines if "eval" in x]}


def smollm2(work: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from harnessrl.models.smollm2 import prepare_smollm2
    from harnessrl.train.runs import checkpoint

    work.mkdir(parents=True, exist_ok=True)
    path = prepare_smollm2()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    trainer = Trainer(model=model, args=TrainingArguments(
        output_dir=str(work / "out"), use_cpu=True, report_to="none", save_strategy="no"))
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    ids = torch.randint(0, model.config.vocab_size, (2, 512))
    seconds = []
    for _ in range(2):  # the first step also creates AdamW's state
        started = time.monotonic()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        trainer.optimizer.step()
        trainer.optimizer.zero_grad()
        seconds.append(time.monotonic() - started)
    started = time.monotonic()
    saved = checkpoint.save(trainer, work / "ckpt", {"weight_version": 1, "task_cursor": 0},
                            keep=1)
    save_s = time.monotonic() - started
    size = sum(f.stat().st_size for f in saved.rglob("*") if f.is_file())
    started = time.monotonic()
    checkpoint.verify(saved)
    return {"step_s": seconds[-1], "save_s": save_s, "bytes": size,
            "verify_s": time.monotonic() - started}


def report(run: dict[str, Any] | None, small: dict[str, Any] | None) -> str:
    out = []
    if run is not None:
        step = statistics.median(run["step_s"]) if run["step_s"] else float("nan")
        out += ["### A real async run (tiny model, real vLLM, scripted agent)", "",
                f"median training step (TRL perf/step_s, {len(run['step_s'])} steps): "
                f"{step:.2f} s", "",
                "| what | seconds | size | vs a step |", "|---|---|---|---|"]
        for s in run["saves"]:
            out.append(f"| checkpoint at step {s['step']} | {s['seconds']:.2f} | "
                       f"{s['bytes'] / 1e6:.1f} MB | {s['seconds'] / step:.2f}x |")
        for at, seconds, rollouts in run["evals"]:
            out.append(f"| eval pass at step {at} ({rollouts} rollouts) | {seconds:.2f} | - | "
                       f"{seconds / step:.2f}x |")
    if small is not None:
        out += ["", "### SmolLM2-135M, float32, CPU (no vLLM)", "",
                "| what | seconds | size | vs a step |", "|---|---|---|---|",
                f"| one optimizer step (2 x 512 tokens, fwd+bwd+AdamW) | "
                f"{small['step_s']:.2f} | - | 1x |",
                f"| one checkpoint (write, fsync, sha256, rename) | {small['save_s']:.2f} | "
                f"{small['bytes'] / 1e6:.0f} MB | {small['save_s'] / small['step_s']:.2f}x |",
                f"| verifying it on --resume (sha256 of every file) | {small['verify_s']:.2f}"
                f" | - | {small['verify_s'] / small['step_s']:.2f}x |"]
    return "\n".join(out) + "\n"


def run(argv: list[str] | None = None) -> str:
    """The report (Markdown), also written to --out (bench/run.py keeps it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=3)
    parser.add_argument("--skip-run", action="store_true")
    parser.add_argument("--skip-smollm2", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="harnessrl-long-") as tmp:
        work = Path(tmp)
        trained = None if args.skip_run else real_run(args, work / "a")
        small = None if args.skip_smollm2 else smollm2(work / "b")
    text = report(trained, small)
    if args.out:
        args.out.write_text(text)
    return text


if __name__ == "__main__":
    print(run())
