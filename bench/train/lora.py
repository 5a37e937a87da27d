#!/usr/bin/env python3
"""LoRA against full fine-tuning (issue 44, item 6), in one run on this machine.

`harnessrl train`'s own code (TRL's async trainer, real vLLM, the scripted agent of
tests/long_run_agent.py as the harness), once with every weight training and once with
`[lora]`, same model, tasks, steps and seed, against one vLLM server (each run's cold sync
puts its own starting weights there). Per run, from its metrics.jsonl (TRL's own figures):
the trainer's compute per step (`perf/fwd_bwd_s` + `perf/optimizer_s`), the whole step
(`perf/step_s`, rollout waits included), the weight sync (`perf/weight_sync_s`: merged
weights by file in both runs, so LoRA adds the merge and unmerge); the checkpoint written
after the last step (its size on disk and its time) and RUN_DIR/model's size; trainable
parameters. Medians over the steps after the first (the first builds AdamW's state).

Figures only; nothing is asserted. Run under the heavy lock:

    flock /tmp/heavy.lock .venv/bin/python bench/train/lora.py [--model tiny|smollm2]
        [--steps 4] [--rank 16] [--out bench/lora.md]
"""

from __future__ import annotations

import argparse
import json
import math
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
          "timeout": 300} for i in range(6)]


def _config(work: Path, model: Path, url: str, steps: int, lora: dict[str, Any] | None
            ) -> Path:
    from tests.helpers import train_toml

    tasks = work / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps(t) for t in TASKS))
    return train_toml(
        work / "train.toml", run_dir=work / "run", model=model, url=f"{url}/v1",
        max_tokens=16, harnesses=["agent-chat"], tasks=tasks, rollout={"concurrency": 4},
        grpo={"steps": steps, "num_generations": 2, "tasks_per_step": 2, "max_inflight": 4,
              "max_staleness": 8, "learning_rate": 1e-4, "trl": {"queue_maxsize": 4}},
        checkpoint={"every_steps": steps, "keep": 1}, lora=lora)


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def one_run(name: str, lora: dict[str, Any] | None, model: Path, url: str, steps: int, work: Path
            ) -> dict[str, Any]:
    from rich.console import Console

    from harnessrl.train.config import load_config
    from harnessrl.train.loop import train
    from harnessrl.train.runs import checkpoint

    work.mkdir(parents=True)
    saves: list[float] = []
    real = checkpoint.save

    def timed(*args: Any, **kwargs: Any) -> Path:
        started = time.monotonic()
        try:
            return real(*args, **kwargs)
        finally:
            saves.append(time.monotonic() - started)

    checkpoint.save = timed
    started = time.monotonic()
    try:
        train(load_config(_config(work, model, url, steps, lora)),
              console=Console(file=open(os.devnull, "w")))  # noqa: SIM115
    finally:
        checkpoint.save = real
    wall = time.monotonic() - started
    lines = [json.loads(x) for x in (work / "run" / "metrics.jsonl").read_text().splitlines()]

    def median(key: str) -> float:
        values = [x["trl"][key] for x in lines[1:] if x["trl"].get(key) is not None]
        return statistics.median(values) if values else float("nan")

    [ckpt] = checkpoint.complete(work / "run" / "checkpoints")
    trl = lines[-1]["trl"]
    return {"name": name, "wall_s": wall, "steps": len(lines),
            "compute_s": median("perf/fwd_bwd_s") + median("perf/optimizer_s"),
            "fwd_bwd_s": median("perf/fwd_bwd_s"), "optimizer_s": median("perf/optimizer_s"),
            "step_s": median("perf/step_s"), "sync_s": median("perf/weight_sync_s"),
            "tokens": median("batch/trained_tokens_per_step"),
            "ckpt_bytes": _size(ckpt), "ckpt_s": saves[-1] if saves else float("nan"),
            "model_bytes": _size(work / "run" / "model"),
            "trainable": trl.get("lora/trainable_params"),
            "merged_sync": trl.get("lora/merged_sync")}


def report(runs: list[dict[str, Any]], model: str, params: int, steps: int) -> str:
    full = runs[0]
    out = [f"Model: {model} ({params / 1e6:.2f} M parameters), float32, CPU; {steps} steps "
           "each (medians over steps 2..N), one vLLM server; sync by file in both (LoRA: "
           "merged weights).", "",
           "| run | trainable params | compute/step s (fwd+bwd, optimizer) | step s | "
           "weight sync s | checkpoint | checkpoint s | RUN_DIR/model | wall s |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        trainable = params if r["trainable"] is None else int(r["trainable"])
        out.append(
            f"| {r['name']} | {trainable:,} | {r['compute_s']:.2f} ({r['fwd_bwd_s']:.2f}, "
            f"{r['optimizer_s']:.3f}) | {r['step_s']:.2f} | {r['sync_s']:.2f} | "
            f"{r['ckpt_bytes'] / 1e6:.2f} MB | {r['ckpt_s']:.2f} | "
            f"{r['model_bytes'] / 1e6:.1f} MB | {r['wall_s']:.0f} |")
    for r in runs[1:]:
        out += ["", f"{r['name']} / full: compute {r['compute_s'] / full['compute_s']:.2f}x, "
                f"step {r['step_s'] / full['step_s']:.2f}x, sync "
                f"{r['sync_s'] / full['sync_s']:.2f}x, checkpoint size "
                f"{r['ckpt_bytes'] / full['ckpt_bytes']:.3f}x, checkpoint time "
                f"{r['ckpt_s'] / full['ckpt_s']:.2f}x (trained tokens per step "
                f"{r['tokens']:.0f} vs {full['tokens']:.0f})"]
    return "\n".join(out) + "\n"


def run(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    from rich.console import Console
    from tests import long_run_agent

    from harnessrl.proxy.engines.vllm_server import VLLMServer
    from harnessrl.train.loop import resolve_model

    long_run_agent.install()
    model = resolve_model(args.model, Console(stderr=True))
    params = _params(model)
    lora = {"rank": args.rank, "alpha": 2 * args.rank}
    with tempfile.TemporaryDirectory(prefix="harnessrl-lora-") as tmp, VLLMServer(
            model=str(model), served_name=args.model, dtype="float32", max_model_len=4096,
            extra_args=["--seed", "0"], log_path=Path(tmp) / "vllm.log") as server:
        runs = [one_run("full fine-tuning", None, model, server.url, args.steps,
                        Path(tmp) / "full"),
                one_run(f"LoRA rank {args.rank}, alpha {2 * args.rank}, 7 projections", lora,
                        model, server.url, args.steps, Path(tmp) / "lora")]
    text = report(runs, args.model, params, args.steps)
    if args.out:
        args.out.write_text(text)
    return text


def _params(model: Path) -> int:
    from safetensors import safe_open

    total = 0
    for file in model.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            for key in f.keys():  # noqa: SIM118  # safe_open is not iterable
                total += math.prod(f.get_slice(key).get_shape())
    return total


if __name__ == "__main__":
    print(run())
