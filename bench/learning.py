#!/usr/bin/env python3
"""Does training through harnessrl move the model the way the reward says? Figures, not a test.

Two `harnessrl train` runs from the same weights and seed against one vLLM: **shaped**, whose
reward adds a cost per sampled token on every rollout (`--term`, default the demo's
`harnessrl.demo:brevity`, which a model can answer at once by writing less), and
**control**, the same with the term off. vLLM is reset to the starting weights between them.
Per weight version (the optimizer step that sampled it, from each turn's own
`weight_version`), the mean sampled tokens per model call over that version's rollouts,
with a 95% interval (1.96 standard errors over rollouts); a PNG of both curves. Then the
weights as the shaped run left them, and the starting weights, are evaluated with
`harnessrl eval` in a second harness the model was not trained in (`--eval-harness`), on
the same tasks. Whatever is seen is reported; nothing is asserted.

    .venv/bin/python bench/learning.py [--model smollm2] [--steps 8] [--harness mini-swe-agent]
        [--eval-harness aider] [--tasks bundled:create-hello-file,reverse-words]
        [--out bench/learning.md] [--plot bench/learning.png]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import msgspec
from rich.console import Console

from harnessrl.proxy.store import TraceReader
from harnessrl.train.config import TrainConfig
from harnessrl.train.loop import resolve_model, train

RUNS = ("shaped", "control")


def config_for(run: str, args: argparse.Namespace, run_dir: Path, url: str) -> TrainConfig:
    raw = {
        "run_dir": str(run_dir), "model": {"path": args.model},
        "engine": {"url": url, "mode": args.mode, "max_tokens": args.max_tokens},
        "rollout": {"harnesses": [args.harness], "tasks": args.tasks,
                    "concurrency": args.inflight, "retries": 0, "hide_host": False,
                    "agent_timeout": args.agent_timeout,
                    "max_model_calls": args.max_model_calls},
        "grpo": {"trainer": args.trainer, "steps": args.steps,
                 "num_generations": args.generations, "tasks_per_step": args.tasks_per_step,
                 "max_inflight": args.inflight, "max_staleness": 1,
                 "learning_rate": args.lr, "seed": args.seed},
        "shaping": {"custom": [args.term] if run == "shaped" else []},
    }
    return msgspec.convert(raw, type=TrainConfig)


def version_step(version: str | None) -> int:
    """`step-3`, `v3` -> 3; the weights vLLM started with (no version yet) -> 0."""
    digits = re.findall(r"\d+", version or "")
    return int(digits[-1]) if digits else 0


def per_version(run_dir: Path) -> dict[int, list[float]]:
    """Weight version -> each scored rollout's mean sampled tokens per model call, for the
    rollouts whose first sampled call that version served."""
    store = TraceReader(run_dir)
    out: dict[int, list[float]] = {}
    for outcome in store.outcomes():
        if outcome.status != "done":
            continue
        calls = [t for t in store.turns(outcome.rollout)
                 if t.status == "ok" and t.completion is not None]
        if not calls:
            continue
        tokens = [len(t.completion.tokens.completion_ids) for t in calls]
        out.setdefault(version_step(calls[0].weight_version), []).append(
            sum(tokens) / len(tokens))
    return dict(sorted(out.items()))


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% interval (0 for a single value: not known)."""
    mean = statistics.fmean(values)
    half = 1.96 * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return mean, half


def difference(curves: dict[str, dict[int, list[float]]], last: int = 3) -> str:
    """shaped - control over the rollouts of the last `last` weight versions both runs
    sampled (after training had time to act), with a 95% interval (Welch's standard error):
    the one figure that says whether the runs differ beyond their own noise."""
    common = sorted(set(curves.get("shaped", {})) & set(curves.get("control", {})))[-last:]
    pooled = {run: [v for s in common for v in curves[run][s]] for run in RUNS}
    if not common or any(len(values) < 2 for values in pooled.values()):
        return "Too few rollouts in the last versions to compare the runs."
    (m1, v1, n1), (m0, v0, n0) = ((statistics.fmean(vs), statistics.variance(vs), len(vs))
                                  for vs in (pooled["shaped"], pooled["control"]))
    half = 1.96 * math.sqrt(v1 / n1 + v0 / n0)
    verdict = ("outside" if abs(m1 - m0) > half else "inside")
    return (f"Versions {common[0]}-{common[-1]} pooled: shaped {m1:.1f} ({n1} rollouts), "
            f"control {m0:.1f} ({n0}); shaped - control = {m1 - m0:+.1f} ± {half:.1f} "
            f"tokens per call (95%): the difference is {verdict} the noise.")


def reset_weights(url: str, model_dir: Path) -> None:
    """vLLM back to the starting weights, so the control run starts where the shaped one did."""
    for path, body in (("/collective_rpc", {"method": "reload_weights",
                                             "kwargs": {"weights_path": str(model_dir)}}),
                       ("/reset_prefix_cache", None),
                       ("/update_weight_version", {"new_version": "start"})):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url + path, data=data, method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            response.read()


def evaluate(label: str, args: argparse.Namespace, root: Path, url: str) -> dict[str, float]:
    """`harnessrl eval` in the second harness against the weights vLLM serves now."""
    run_dir = root / f"eval-{label}"
    subprocess.run([str(Path(sys.executable).with_name("harnessrl")), "eval", "--harness",
                    args.eval_harness, "--tasks", args.tasks, "-k", str(args.eval_samples),
                    "--engine-url", url, "--run-dir", str(run_dir), "--no-hide",
                    "--agent-timeout", str(args.agent_timeout),
                    "--max-tokens", str(args.max_tokens),
                    "--temperature", str(args.eval_temperature)]
                   + (["--max-model-calls", str(args.max_model_calls)]
                      if args.max_model_calls else []), check=True)
    values = [v for vs in per_version(run_dir).values() for v in vs]
    outcomes = [o for o in TraceReader(run_dir).outcomes() if o.status == "done"]
    mean, half = interval(values) if values else (float("nan"), 0.0)
    return {"rollouts": len(outcomes), "mean": mean, "half": half,
            "passed": sum((o.verifier_reward or 0) >= 1 for o in outcomes)}


def plot(curves: dict[str, dict[int, list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for run, points in curves.items():
        steps = list(points)
        stats = [interval(points[s]) for s in steps]
        ax.errorbar(steps, [m for m, _ in stats], yerr=[h for _, h in stats], capsize=3,
                    marker="o", label=run)
    ax.set_xlabel("weight version that sampled the rollout (it advances once per step)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("sampled tokens per model call")
    ax.set_title("shaped (a cost per sampled token) vs control, mean and 95% interval")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def report(curves: dict[str, dict[int, list[float]]], evals: dict[str, dict[str, float]],
           args: argparse.Namespace, minutes: float) -> str:
    lines = [f"# Learning through harnessrl ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
             "", f"Command: `python bench/learning.py {' '.join(sys.argv[1:])}`; model "
             f"{args.model}, {args.trainer} trainer, {args.steps} steps, lr {args.lr}, term "
             f"`{args.term}`; {os.cpu_count()} cores, load average (1 min) "
             f"{os.getloadavg()[0]:.1f} at the end; {minutes:.0f} min in all.", "",
             "Sampled tokens per model call, per weight version (mean ± 95% interval, "
             "rollouts):", "", "| version | " + " | ".join(RUNS) + " |",
             "|---|" + "---|" * len(RUNS)]
    for step in sorted({s for points in curves.values() for s in points}):
        cells = []
        for run in RUNS:
            values = curves.get(run, {}).get(step)
            if not values:
                cells.append("-")
                continue
            mean, half = interval(values)
            cells.append(f"{mean:.1f} ± {half:.1f} ({len(values)})")
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    lines += ["", difference(curves)]
    lines += ["", f"In `{args.eval_harness}` (not trained in), {args.eval_samples} rollouts "
              "per task:", "", "| weights | scored rollouts | solved | sampled tokens per "
              "call (mean ± 95%) |", "|---|---|---|---|"]
    for label, e in evals.items():
        lines.append(f"| {label} | {e['rollouts']:.0f} | {e['passed']:.0f} | "
                     f"{e['mean']:.1f} ± {e['half']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--trainer", default="async", choices=["async", "sync"])
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--term", default="harnessrl.demo:brevity")
    parser.add_argument("--mode", default="token", choices=["token", "chat"])
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--inflight", type=int, default=4)
    parser.add_argument("--generations", type=int, default=2, help="rollouts per GRPO group")
    parser.add_argument("--tasks-per-step", type=int, default=2)
    parser.add_argument("--agent-timeout", type=float, default=120)
    parser.add_argument("--max-model-calls", type=int, default=None,
                        help="each rollout's step cap in the proxy (shorter rollouts, shorter "
                        "training rows: more steps in the same time on a CPU)")
    parser.add_argument("--harness", default="mini-swe-agent")
    parser.add_argument("--eval-harness", default="aider")
    parser.add_argument("--eval-samples", type=int, default=2)
    parser.add_argument("--eval-temperature", type=float, default=1.0,
                        help="sampling temperature in the second harness (training's; a "
                        "harness's own, aider's 0 say, gives the same reply every time)")
    parser.add_argument("--tasks", default="bundled:create-hello-file,reverse-words")
    parser.add_argument("--out", type=Path, default=Path("bench/learning.md"))
    parser.add_argument("--plot", type=Path, default=Path("bench/learning.png"))
    args = parser.parse_args()
    console = Console()
    from harnessrl.proxy.engines.vllm_server import VLLMServer

    started = time.monotonic()
    model = resolve_model(args.model, console)
    curves: dict[str, dict[int, list[float]]] = {}
    evals: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, VLLMServer(
            model=str(model), served_name="policy", dtype="float32", max_model_len=8192,
            log_path=Path(tmp) / "vllm.log") as server:
        root = Path(tmp)
        evals["starting weights"] = evaluate("start", args, root, server.url)
        for run in RUNS:
            reset_weights(server.url, model)
            train(config_for(run, args, root / run, server.url), console=console)
            curves[run] = per_version(root / run)
            if run == "shaped":
                evals["after the shaped run"] = evaluate("shaped", args, root, server.url)
    plot(curves, args.plot)
    text = report(curves, evals, args, (time.monotonic() - started) / 60)
    args.out.write_text(text)
    console.print(text)


if __name__ == "__main__":
    main()
