#!/usr/bin/env python3
"""Synchronous vs asynchronous GRPO, and the asynchronous trainer locally vs on a Ray
cluster, in one run: same tasks, harnesses, model and steps.

`harnessrl train` against one vLLM (tiny model unless --model), once per `--runs` entry:
`sync` (GRPOTrainer, each step waits for its batch; one chain per rollout), `async`
(AsyncGRPOTrainer, `--inflight` rollouts always running, every chain trained) and
`async-cluster` (the same, its rollouts on a 2-node Ray cluster started on this machine
with `ray.cluster_utils.Cluster`: two raylets, one rollout node actor each, the driver's
store the one training reads). Prints wall time per optimizer step, steps and rollouts per
hour, the trainer's idle share, and per harness, from each run's own store: rows per
rollout and sampled tokens trained / sampled tokens captured with all chains and with the
main chain only (captured: the sampled tokens of the rollouts' finished calls; cancelled
calls and rollouts cut at the end are no part of it).

Then the hold per weight swap (`--swaps` each; the gate held from `pause` to `resume`, as
the trainer's calls wait it out) with 1 vLLM server, 2 reloaded one after the other, and 2
reloaded at once, the three interleaved so the machine's load falls on each alike.
Figures only; nothing is asserted.

    .venv/bin/python bench/train/async_training.py [--steps 3] [--inflight 4]
        [--runs sync,async,async-cluster] [--swaps 6] [--harnesses mini-swe-agent]
        [--tasks bundled:create-hello-file,reverse-words] [--out bench/train/async_training.md]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
from rich.console import Console

from harnessrl.store.reader import TraceReader
from harnessrl.train.async_grpo.groups import captured_tokens, main_chain_tokens, rows_of
from harnessrl.train.config import TrainSettings
from harnessrl.train.loop import resolve_model, train


def config_for(run: str, args: argparse.Namespace, run_dir: Path, url: str,
               cluster: str | None = None) -> TrainSettings:
    trainer = run.split("-")[0]
    raw: dict[str, object] = {
        "run_dir": str(run_dir), "model": {"path": args.model},
        "engine": {"url": url, "max_tokens": args.max_tokens},
        "rollout": {"harnesses": args.harnesses.split(","), "tasks": args.tasks,
                    "concurrency": args.inflight, "retries": 0, "hide_host": False,
                    "agent_timeout": args.agent_timeout},
        "grpo": {"trainer": trainer, "steps": args.steps, "num_generations": 2,
                 "tasks_per_step": 2, "max_inflight": args.inflight,
                 "max_staleness": args.staleness, "learning_rate": 1e-3},
    }
    if cluster is not None:
        raw["cluster"] = {"address": cluster, "cpus_per_rollout": 0.25}
    return msgspec.convert(raw, type=TrainSettings)


def store_figures(run_dir: Path) -> dict[str, dict[str, float]]:
    """Per harness, over the scored rollouts of the run's store."""
    store = TraceReader(run_dir)
    out: dict[str, dict[str, float]] = {}
    for o in store.outcomes():
        if o.status != "done":
            continue
        turns = store.turns(o.rollout)
        f = out.setdefault(o.harness, dict.fromkeys(
            ("rollouts", "rows", "captured", "all_chains", "main_chain"), 0.0))
        rows = rows_of(turns)
        f["rollouts"] += 1
        f["rows"] += len(rows)
        f["captured"] += captured_tokens(turns)
        f["all_chains"] += sum(sum(s.mask) for s in rows)
        f["main_chain"] += main_chain_tokens(turns)
    return out


def run_one(trainer: str, args: argparse.Namespace, root: Path, url: str,
            console: Console, cluster: str | None = None) -> dict[str, object]:
    run_dir = root / trainer
    stamps: list[float] = []
    started = time.monotonic()
    lines = train(config_for(trainer, args, run_dir, url, cluster), console=console,
                  on_step=lambda _line: stamps.append(time.monotonic()))
    wall = time.monotonic() - started
    outcomes = TraceReader(run_dir).outcomes()
    gaps = [b - a for a, b in zip([started, *stamps], stamps, strict=False)]
    idle = ([line.get("trainer_idle_share") for line in lines] if trainer != "sync" else
            [line["rollout_seconds"] / g for line, g in zip(lines, gaps, strict=False)
             if line.get("rollout_seconds") is not None])
    idle = [v for v in idle if v is not None]
    return {"trainer": trainer, "steps": len(lines), "wall": wall,
            "step_s": sum(gaps[1:]) / max(1, len(gaps) - 1) if len(gaps) > 1 else wall,
            "rollouts": len(outcomes), "idle": sum(idle) / len(idle) if idle else None,
            "figures": store_figures(run_dir)}


def report(results: list[dict], args: argparse.Namespace) -> str:
    lines = [f"# Sync vs async GRPO ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
             "", f"Command: `python bench/train/async_training.py --steps {args.steps} --inflight "
             f"{args.inflight} --runs {args.runs} --swaps {args.swaps} --harnesses "
             f"{args.harnesses} --tasks {args.tasks}`; model "
             f"{args.model}, max_tokens {args.max_tokens}, {os.cpu_count()} cores, load average "
             f"(1 min) {os.getloadavg()[0]:.1f} at the end.", "",
             "| trainer | steps | wall s | s per step (after the first) | steps/h | "
             "rollouts/h | trainer idle share |", "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['trainer']} | {r['steps']} | {r['wall']:.0f} | {r['step_s']:.1f}"
                     f" | {3600 / r['step_s']:.0f} | {3600 * r['rollouts'] / r['wall']:.0f} | "
                     f"{'-' if r['idle'] is None else format(r['idle'], '.0%')} |")
    by = {r["trainer"]: r for r in results}
    if {"sync", "async"} <= by.keys():
        ratio = by["sync"]["step_s"] / by["async"]["step_s"]
        verdict = "PASS" if ratio >= 1.5 else "FAIL"
        lines += ["", f"Async takes {ratio:.2f}x the sync steps per hour (target 1.5x with 4+ "
                  f"rollouts in flight): {verdict}."]
    if {"async", "async-cluster"} <= by.keys():
        ratio = by["async"]["step_s"] / by["async-cluster"]["step_s"]
        lines += ["", f"Async on the 2-node Ray cluster takes {ratio:.2f}x the local async "
                  "steps per hour. Both raylets share this machine's cores with vLLM and the "
                  "trainer: the ratio shows what Ray's hops and the shards cost or save here, "
                  "not a scale-out gain (more nodes add cores only on more machines)."]
    lines += ["", "| trainer | harness | scored rollouts | rows per rollout (all chains) | "
              "sampled tokens trained / captured, all chains | main chain only |",
              "|---|---|---|---|---|---|"]
    for r in results:
        for harness, f in r["figures"].items():
            cap = f["captured"] or float("nan")
            lines.append(f"| {r['trainer']} | {harness} | {f['rollouts']:.0f} | "
                         f"{f['rows'] / max(f['rollouts'], 1):.2f} | "
                         f"{f['all_chains'] / cap:.0%} | {f['main_chain'] / cap:.0%} |")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def ray_cluster(nodes: int = 2) -> Iterator[str]:
    """A Ray cluster on this machine: a head with no CPU for rollouts, `nodes` raylets of
    one CPU each; its address."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray.cluster_utils import Cluster

    made = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "node_ip_address": "127.0.0.1", "include_dashboard": False})
    for _ in range(nodes):
        made.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    made.wait_for_nodes()
    try:
        yield str(made.address)
    finally:
        ray.shutdown()
        made.shutdown()


def swap_holds(model: Path, urls: list[str], swaps: int, root: Path
               ) -> list[dict[str, object]]:
    """The gate's hold per swap with 1 server, 2 one after the other, 2 at once."""
    import torch
    from transformers import AutoModelForCausalLM

    from harnessrl.proxy.gate import WeightGate
    from harnessrl.train.async_grpo.transfer import FileWeightTransfer
    from harnessrl.train.weights import VLLMWeightSync

    weights = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    # the training runs left the first server at their last version: one name for both
    VLLMWeightSync(urls[0], root / "unused", more_urls=urls[1:]).name("bench-0")
    modes = {"1 server": (urls[:1], True), "2 servers, one after the other": (urls, False),
             "2 servers at once": (urls, True)}
    transfers = {}
    for name, (chosen, parallel) in modes.items():
        sync = VLLMWeightSync(chosen[0], root / name.replace(" ", "_"),
                              more_urls=chosen[1:], parallel=parallel)
        transfer = FileWeightTransfer(sync, model, gates=[WeightGate()])
        transfer.init_weight_transfer()
        transfers[name] = transfer
    for _ in range(swaps):
        for transfer in transfers.values():
            transfer.pause()
            transfer.send_weights(iter(weights.named_parameters()))
            transfer.resume()
    out = []
    for name, transfer in transfers.items():
        reloads = [r.ended - r.started for r in transfer.sync.reloads]
        out.append({"mode": name, "holds": list(transfer.seconds), "reloads": reloads})
    return out


def swap_report(results: list[dict[str, object]], model: str) -> str:
    lines = ["", f"Hold per weight swap ({model}; the gate held from pause to resume: save "
             "once, each server reloads and drops its prefix cache, names the version, and "
             "the proxies stamp what the servers report):", "",
             "| servers | swaps | hold median s | hold min-max s | one server's reload "
             "median s |", "|---|---|---|---|---|"]
    base = None
    for r in results:
        holds, reloads = sorted(r["holds"]), sorted(r["reloads"])  # type: ignore[arg-type]
        median = holds[len(holds) // 2]
        base = base or median
        lines.append(f"| {r['mode']} | {len(holds)} | {median:.3f} ({median / base:.2f}x) | "
                     f"{holds[0]:.3f}-{holds[-1]:.3f} | {reloads[len(reloads) // 2]:.3f} |")
    return "\n".join(lines) + "\n"


def run(argv: list[str] | None = None) -> str:
    """The report (Markdown), also written to --out; the runs' progress goes to stderr, so
    bench/run.py keeps only the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--runs", default="async,async-cluster",
                        help="any of sync, async, async-cluster")
    parser.add_argument("--swaps", type=int, default=6, help="per mode; 0: none")
    parser.add_argument("--inflight", type=int, default=4)
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--agent-timeout", type=float, default=60)
    parser.add_argument("--harnesses", default="mini-swe-agent")
    parser.add_argument("--tasks", default="bundled:create-hello-file,reverse-words")
    parser.add_argument("--out", type=Path, default=Path("bench/train/async_training.md"))
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    from harnessrl.proxy.engines.vllm_server import VLLMServer

    model = resolve_model(args.model, console)
    with tempfile.TemporaryDirectory() as tmp, VLLMServer(
            model=str(model), served_name="policy", dtype="float32", max_model_len=8192,
            log_path=Path(tmp) / "vllm.log") as server:
        results = []
        for run in filter(None, args.runs.split(",")):
            with ray_cluster() if run == "async-cluster" else contextlib.nullcontext() as at:
                results.append(run_one(run, args, Path(tmp), server.url, console, at))
        text = report(results, args) if results else ""
        args.out.write_text(text)  # kept if the swaps below fail
        if args.swaps:
            with VLLMServer(model=str(model), served_name="policy", dtype="float32",
                            max_model_len=8192, log_path=Path(tmp) / "vllm-2.log") as second:
                holds = swap_holds(model, [server.url, second.url], args.swaps, Path(tmp))
            text += swap_report(holds, args.model)
    args.out.write_text(text)
    return text


if __name__ == "__main__":
    print(run())
