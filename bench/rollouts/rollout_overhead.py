#!/usr/bin/env python3
"""Rollout overhead of the runner, excluding the agent's own time.

A harness that answers at once (`sh -c 'exit 0'`) runs on bundled tasks with the local
sandbox, through the real proxy and runner: what remains is sandbox create, task files,
config, verify and teardown. Prints per-rollout overhead (p50/p99) and rollouts per minute
at concurrency 1, 4 and 16, against the target of under 1 s per rollout; then the same with
the docker sandbox (create + verify + remove, images already built) at concurrency 1 and 4,
target under 2 s, when a daemon answers. Each row also splits the overhead p50 into its
phases from the outcomes' own timings: create (sandbox start and task files), verify (the
verifier, tests copied in, its pre-check) and the rest (teardown, the proxy's rollout
open/close, the store), and says the load average when it started. `--repeats` runs the
whole plan again, interleaved, so both sandboxes see the same load.
`bench/rollouts/rollouts.py` (the name issue 16 uses) is this module.

    .venv/bin/python bench/rollouts/rollout_overhead.py [--rollouts 64] [--concurrency 1,4,16]
                                               [--docker-concurrency 1,4] [--repeats 1]
                                               [--out bench/rollouts/rollouts.md]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from harnessrl.harnesses.base import Harness
from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
from harnessrl.rollout.conformance import policy_tokenizer
from harnessrl.rollout.run import execute
from harnessrl.rollout.runner import RolloutSettings, RunSettings
from harnessrl.rollout.tasks.task import load_tasks

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "common")]  # bench/ is not a package

from table import Row, verdict  # noqa: E402


@dataclass(frozen=True)
class Instant(Harness):
    """A harness that exits at once: the agent's time is ~0, so what is left is overhead."""

    def executable(self, tools_dir: Path) -> Path:
        return Path("/bin/true")


INSTANT = Instant(name="instant", version="0", dialect="openai_chat", registry="npm",
                  package="-", binary="true")


TARGET = {"local": 1.0, "docker": 2.0}  # seconds of overhead per rollout, p50


def measure(concurrency: int, rollouts: int, tokenizer: object,
            sandbox: str = "local") -> dict:
    tasks = load_tasks("bundled")
    samples = max(1, rollouts // len(tasks))
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="hrl-bench-") as root:
        config = RunSettings(harnesses=[INSTANT], tasks=tasks, samples=samples,
                           settings=RolloutSettings(concurrency=concurrency, retries=0,
                                                    sandbox=sandbox))  # type: ignore[arg-type]
        started = time.monotonic()
        outcomes = execute(config, ScriptedEngine(tokenizer, replay(["ok"])), Path(root),
                           console=quiet)
        wall = time.monotonic() - started
    timings = [o.timings for o in outcomes if o.timings]
    overheads = sorted(t["total"] - t.get("agent", 0.0) for t in timings) or [float("nan")]

    def p50(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    return {"sandbox": sandbox, "concurrency": concurrency, "rollouts": len(outcomes),
            "load": load, "agent_p50": p50([t.get("agent", 0.0) for t in timings]),
            "create": p50([t.get("sandbox", 0.0) for t in timings]),
            "verify": p50([t.get("verifier", 0.0) for t in timings]),
            "rest": p50([t["total"] - t.get("sandbox", 0.0) - t.get("agent", 0.0)
                         - t.get("verifier", 0.0) for t in timings]),
            "p50": statistics.median(overheads),
            "p99": overheads[min(len(overheads) - 1, int(0.99 * len(overheads)))],
            "per_minute": 60 * len(outcomes) / wall,
            "errors": sum(1 for o in outcomes if o.status != "done")}


async def _build_images() -> None:
    from harnessrl.rollout.sandbox.docker import Images

    images = Images()
    for task in load_tasks("bundled"):
        await images.for_task(task)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--docker-concurrency", default="1,4", help="'' to skip docker")
    parser.add_argument("--repeats", type=int, default=1, help="run the whole plan N times")
    parser.add_argument("--out", type=Path, default=Path("bench/rollouts/rollouts.md"))
    return parser.parse_args(argv)


def measure_all(args: argparse.Namespace) -> list[dict]:
    from harnessrl.rollout.sandbox.docker import docker_problem

    tokenizer = policy_tokenizer()
    plan = [("local", int(c)) for c in args.concurrency.split(",")]
    if args.docker_concurrency and docker_problem() is None:
        asyncio.run(_build_images())  # once, not measured: a cached image is the case timed
        plan += [("docker", int(c)) for c in args.docker_concurrency.split(",")]
    return [measure(c, args.rollouts, tokenizer, s) for _ in range(args.repeats)
            for s, c in plan]


def rows(argv: list[str] | None = None) -> list[Row]:
    """The runner's rows (bench/run.py); also writes --out."""
    args = parse_args(argv)
    results = measure_all(args)
    write(results, args.out)
    return [Row(f"runner overhead per rollout p50 (p99), {r['sandbox']} c={r['concurrency']}",
                f"{r['p50']:.2f} s ({r['p99']:.2f})",
                f"agent's own time p50 {r['agent_p50']:.3f} s (an agent that exits at once), "
                f"load {r['load']:.1f}; "
                f"{r['per_minute']:.0f} rollouts/min, {r['errors']} infra errors",
                f"< {TARGET[r['sandbox']]:g} s", verdict(r["p50"] < TARGET[r["sandbox"]]))
            for r in results]


def write(results: list[dict], out: Path) -> str:
    lines = ["| sandbox | concurrency | rollouts | load avg (1 min) at start | overhead p50 s | "
             "overhead p99 s | create p50 s | verify p50 s | rest p50 s | rollouts/min | "
             "infra errors | target (p50) |", "|" + "---|" * 12]
    for r in results:
        target = TARGET[r["sandbox"]]
        lines.append(f"| {r['sandbox']} | {r['concurrency']} | {r['rollouts']} | "
                     f"{r['load']:.1f} | {r['p50']:.2f} | {r['p99']:.2f} | {r['create']:.2f} | "
                     f"{r['verify']:.2f} | {r['rest']:.2f} | {r['per_minute']:.0f} | "
                     f"{r['errors']} | < {target:g} s {verdict(r['p50'] < target)} |")
    table = "\n".join(lines) + "\n"
    out.write_text("# Rollout overhead (agent that exits at once; docker: cached images)\n\n"
                   f"{os.cpu_count()} cores, shared: the load average is the machine's, "
                   "other work included.\n\n" + table)
    return table


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(write(measure_all(args), args.out))


if __name__ == "__main__":
    main()
