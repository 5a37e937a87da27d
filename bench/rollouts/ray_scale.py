#!/usr/bin/env python3
"""Scale-out figures for issue 17: what Ray adds per rollout, and how many open rollouts
sharded capture proxies hold.

`overhead`: the same instant agent (a harness that exits at once) on the bundled tasks in
the local sandbox, one rollout at a time, run twice in the same process: by the local
`Runner` behind one proxy, and by `ClusterRunner` on a local one-node Ray (a rollout node
actor with its proxy shard, each finished rollout shipped back and written into the run's
store by the driver). The figure is the time between consecutive finished rollouts as the
driver sees them (everything a rollout costs end to end, the first one left out); Ray's
share is the difference of the two medians. Target: Ray adds <= 0.2 s per rollout.

`shards`: N proxy shards, each the real app and store in its own process with the scripted
engine paced at `--rate` tokens/s per stream (`bench/proxy/load_server.py`), and `--rollouts`
open rollouts spread over them by a stable hash of their index (as a router would). Each
rollout streams `--tokens`-token chat replies (`--min-turns`-`--max-turns` calls that
resend the growing history, `--think` s of pause between calls, as an agent's tool runs),
then a new rollout starts in its place, until `--duration` s are over and the calls in
flight finish. Reported per shard count: errors (HTTP, error events, broken streams),
lost turns (a completed call with no `ok` turn in its shard's store), duplicated turns,
time to first token p50/p99, turns completed, and the CPU of the shards and the client.
The client is one uvloop process with raw aiohttp SSE clients (`bench/proxy/load.py`'s).
Target: 4 shards hold >= 1,000 open rollouts for 10 minutes with 0 errors, 0 lost turns.

    .venv/bin/python bench/rollouts/ray_scale.py                       # both parts, defaults below
    .venv/bin/python bench/rollouts/ray_scale.py --parts shards --shards 4 --rollouts 1000 \\
        --duration 600                                          # the issue's full figure
    .venv/bin/python bench/rollouts/ray_scale.py --parts overhead --overhead-rollouts 32

Writes `--out` (bench/rollouts/ray_scale.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# this group, bench/common and bench/proxy (the load bench's client, server and /proc readers)
PATHS = [str(HERE), str(HERE.parent / "common"), str(HERE.parent / "proxy")]
# Ray would resolve 127.0.0.1 to this machine's outward address; this keeps it on loopback.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


# ------------------------------------------------------------------ overhead: Ray vs local
def scripted_engine() -> Any:
    """Built where it runs (on the node, for Ray): the scripted engine answering "ok"."""
    from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
    from harnessrl.rollout.conformance import policy_tokenizer

    return ScriptedEngine(policy_tokenizer(), replay(["ok"]))


def _intervals(stamps: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(stamps[1:])]  # the first one out


def overhead_local(rollouts: int, root: Path) -> list[float]:
    from rollout_overhead import INSTANT

    from harnessrl.proxy.serve import running
    from harnessrl.rollout.runner import RolloutSettings, Runner, RunSettings
    from harnessrl.rollout.tasks.task import load_tasks

    tasks = load_tasks("bundled")
    config = RunSettings(harnesses=[INSTANT], tasks=tasks, samples=max(1, rollouts // len(tasks)),
                       settings=RolloutSettings(concurrency=1, retries=0))
    stamps = [time.monotonic()]
    with running(scripted_engine(), root) as served:
        runner = Runner(config, served.store, served.url, root,
                        on_outcome=lambda _o: stamps.append(time.monotonic()))
        outcomes = asyncio.run(runner.run(runner.pending()))
    _check_done(outcomes, "local")
    return _intervals(stamps)


def overhead_ray(rollouts: int, root: Path) -> list[float]:
    import ray
    from rollout_overhead import INSTANT

    from harnessrl.rollout.cluster.driver import ClusterRunner, ClusterSettings
    from harnessrl.rollout.runner import RolloutSettings, RunSettings
    from harnessrl.rollout.tasks.task import load_tasks
    from harnessrl.store.writer import TraceStore

    if not ray.is_initialized():  # the nodes' workers import this file's helpers from bench/
        ray.init(log_to_driver=False, include_dashboard=False, _node_ip_address="127.0.0.1",
                 runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(PATHS)}})
    tasks = load_tasks("bundled")
    config = RunSettings(harnesses=[INSTANT], tasks=tasks, samples=max(1, rollouts // len(tasks)),
                       settings=RolloutSettings(concurrency=1, retries=0))
    stamps: list[float] = []
    with TraceStore(root) as store, ClusterRunner(
            config, store, root, scripted_engine, ClusterSettings(slots_per_node=1),
            on_outcome=lambda _o: stamps.append(time.monotonic())) as runner:
        runner.start()  # placing the node and starting its shard is not per rollout
        stamps.append(time.monotonic())
        outcomes = asyncio.run(runner.run(runner.pending()))
    _check_done(outcomes, "ray")
    return _intervals(stamps)


def _check_done(outcomes: list[Any], where: str) -> None:
    failed = [o.error for o in outcomes if o.status != "done"]
    if failed:
        raise RuntimeError(f"{where}: {len(failed)} rollouts failed: {failed[0]}")


def measure_overhead(args: argparse.Namespace) -> dict[str, Any]:
    sys.path[:0] = PATHS
    local: list[float] = []
    ray_: list[float] = []
    loads = [os.getloadavg()[0]]
    for _ in range(args.overhead_repeats):  # interleaved: both see the same machine
        with tempfile.TemporaryDirectory(prefix="hrl-rayscale-") as root:
            local += overhead_local(args.overhead_rollouts, Path(root) / "local")
            ray_ += overhead_ray(args.overhead_rollouts, Path(root) / "ray")
        loads.append(os.getloadavg()[0])
    with contextlib.suppress(ImportError):
        import ray

        ray.shutdown()
    return {"local": local, "ray": ray_, "loads": loads}


# ------------------------------------------------------------------ shards: open rollouts
@contextlib.contextmanager
def shard_processes(count: int, args: argparse.Namespace, work: Path
                    ) -> Iterator[list[tuple[int, str, Path]]]:
    """`count` proxy shards (bench/proxy/load_server.py), each with its own store: (pid, url,
    run dir)."""
    from load import free_port, wait_healthy

    server = [sys.executable, str(HERE.parent / "proxy" / "load_server.py")]
    pool = ["--pool", str(work / "pool.json"), "--seed", str(args.seed)]
    if not (work / "pool.json").exists():
        subprocess.run([*server, *pool, "--write-pool", "--min-tokens", str(args.tokens),
                        "--max-tokens", str(args.tokens)], check=True)
    procs: list[tuple[subprocess.Popen[bytes], str, Path]] = []
    try:
        for n in range(count):
            port, run_dir = free_port(), work / f"shards{count}" / f"shard{n}"
            log = work / f"shards{count}-{n}.log"
            with log.open("wb") as handle:
                proc = subprocess.Popen(
                    [*server, *pool, "--port", str(port), "--run-dir", str(run_dir),
                     "--rate", f"{args.rate:g}"], stdout=handle, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL)
            procs.append((proc, f"http://127.0.0.1:{port}", run_dir))
            wait_healthy(proc, f"http://127.0.0.1:{port}", log)
        yield [(p.pid, url, run_dir) for p, url, run_dir in procs]
    finally:
        for proc, _url, _dir in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc, _url, _dir in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def open_rollouts(args: argparse.Namespace, shards: list[tuple[int, str, Path]]
                        ) -> dict[str, Any]:
    import aiohttp
    import msgspec
    from load import Plan, StreamError, Tally, conversation
    from procstat import cpu_s, run_delay_s

    tallies = [Tally() for _ in shards]
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=args.tokens / args.rate + 120)
    rng = random.Random(args.seed)
    open_now, peak = [0], [0]
    cpu0 = [cpu_s(pid) for pid, _u, _d in shards] + [time.process_time()]
    wait0 = [run_delay_s(pid) for pid, _u, _d in shards]
    load0 = os.getloadavg()[0]
    start = time.monotonic()
    deadline = start + args.duration

    async def rollout_slot(index: int, http: aiohttp.ClientSession) -> None:
        shard = zlib.crc32(f"rollout-{index}".encode()) % len(shards)  # stable, like a router
        plan = Plan(shards[shard][1], (args.min_turns, args.max_turns), deadline, args.think,
                    random.Random(rng.random()))
        tally = tallies[shard]
        await asyncio.sleep(plan.rng.uniform(0, args.stagger))
        while time.monotonic() < deadline:
            open_now[0] += 1
            peak[0] = max(peak[0], open_now[0])
            try:
                await conversation(http, "chat", plan, tally)
            except (TimeoutError, StreamError, aiohttp.ClientError, KeyError,
                    msgspec.DecodeError) as exc:
                tally.error("chat", exc)
                await asyncio.sleep(0.5)
            finally:
                open_now[0] -= 1

    async def progress() -> None:
        while True:
            await asyncio.sleep(30)
            print(f"  {time.monotonic() - start:5.0f} s: {open_now[0]} open, "
                  f"{sum(len(t.completed) for t in tallies):,} turns, "
                  f"{sum(sum(t.errors.values()) for t in tallies)} errors", flush=True)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        ticker = asyncio.create_task(progress())
        await asyncio.gather(*(rollout_slot(i, http) for i in range(args.rollouts)))
        ticker.cancel()
    wall = time.monotonic() - start
    cpu1 = [cpu_s(pid) for pid, _u, _d in shards] + [time.process_time()]
    wait1 = [run_delay_s(pid) for pid, _u, _d in shards]
    return {"tallies": tallies, "wall": wall, "peak_open": peak[0], "load0": load0,
            "load1": os.getloadavg()[0],
            "shard_cpu": [100 * (b - a) / wall for a, b in zip(cpu0[:-1], cpu1[:-1],
                                                                strict=True)],
            "client_cpu": 100 * (cpu1[-1] - cpu0[-1]) / wall,
            # The shards' event-loop threads runnable but waiting for a CPU: the box's share
            # of the lag (other work on the 2 cores), not the proxy's.
            "shard_wait": [100 * (b - a) / wall for a, b in zip(wait0, wait1, strict=True)]}


def measure_shards(args: argparse.Namespace, count: int, work: Path) -> dict[str, Any]:
    import uvloop
    from load import check_store

    sys.path[:0] = PATHS
    with shard_processes(count, args, work) as shards:
        result = uvloop.run(open_rollouts(args, shards))
    stores = [check_store(run_dir / "trace.db", tally)
              for (_pid, _url, run_dir), tally in zip(shards, result["tallies"], strict=True)]
    tallies = result["tallies"]
    ttft = sorted(x for t in tallies for x in t.ttft if not math.isnan(x))
    return {"shards": count, "rollouts": args.rollouts, "duration": args.duration,
            "peak_open": result["peak_open"], "wall": result["wall"],
            "turns": sum(len(t.completed) for t in tallies),
            "conversations": sum(t.conversations for t in tallies),
            "errors": sum(sum(t.errors.values()) for t in tallies),
            "error_samples": [s for t in tallies for s in t.error_samples][:5],
            "lost": sum(s["lost"] for s in stores),
            "duplicated": sum(s["duplicated"] + s["beyond_sent"] for s in stores),
            "integrity": sorted({s["integrity"] for s in stores}),
            "ttft_p50": _pct(ttft, 50), "ttft_p99": _pct(ttft, 99),
            "shard_cpu": result["shard_cpu"], "client_cpu": result["client_cpu"],
            "shard_wait": result["shard_wait"],
            "load": (result["load0"], result["load1"])}


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, max(0, math.ceil(q / 100 * len(values)) - 1))]


# ------------------------------------------------------------------ report
def render(args: argparse.Namespace, overhead: dict[str, Any] | None,
           shards: list[dict[str, Any]]) -> str:
    from table import machine_line

    lines = [f"# Ray scale-out (issue 17), {time.strftime('%Y-%m-%d %H:%M')}", "",
             f"Command: `python bench/rollouts/ray_scale.py {' '.join(sys.argv[1:])}`", "",
             machine_line() + " (shared: the load average is the machine's, other work "
             "included)", ""]
    if overhead is not None:
        local, ray_ = overhead["local"], overhead["ray"]
        added = statistics.median(ray_) - statistics.median(local)
        loads = ", ".join(f"{x:.1f}" for x in overhead["loads"])
        lines += ["## Rollout overhead through Ray vs local (instant agent, local sandbox, "
                  "one at a time)", "",
                  "| path | rollouts timed | per rollout p50 s | mean s | p90 s |",
                  "|---|---|---|---|---|"]
        for name, values in (("local Runner, one proxy", local),
                             ("Ray: one node actor + its proxy shard, driver commits", ray_)):
            lines.append(f"| {name} | {len(values)} | {statistics.median(values):.2f} | "
                         f"{statistics.fmean(values):.2f} | {_pct(sorted(values), 90):.2f} |")
        lines += ["", f"Ray adds {added:+.2f} s per rollout (p50 vs p50); target <= 0.2 s: "
                  f"{'PASS' if added <= 0.2 else 'FAIL'}. Load average (1 min) at the start "
                  f"and after each repeat: {loads}.", ""]
    if shards:
        lines += [f"## Open rollouts held by N proxy shards ({args.tokens}-token chat replies "
                  f"streamed at {args.rate:g} tokens/s, {args.min_turns}-{args.max_turns} "
                  f"calls per rollout, {args.think:g} s pause between calls)", "",
                  "| shards | open rollouts (peak) | seconds | turns completed | errors | "
                  "lost turns | duplicated | TTFT p50 ms | TTFT p99 ms | shard CPU % (each) | "
                  "shard loop waiting for a CPU, % of the time | client CPU % | "
                  "load avg start/end | target |", "|" + "---|" * 14]
        for r in shards:
            ok = r["errors"] == 0 and r["lost"] == 0 and r["duplicated"] == 0
            full = r["shards"] == 4 and r["peak_open"] >= 1000 and r["duration"] >= 600
            target = ("1,000 for 600 s, 0 errors, 0 lost: " + ("PASS" if ok else "FAIL")
                      if full else "0 errors, 0 lost: " + ("PASS" if ok else "FAIL"))
            lines.append(
                f"| {r['shards']} | {r['peak_open']:,} | {r['wall']:.0f} | {r['turns']:,} | "
                f"{r['errors']} | {r['lost']} | {r['duplicated']} | {1000 * r['ttft_p50']:.0f} "
                f"| {1000 * r['ttft_p99']:.0f} | "
                f"{' / '.join(f'{c:.0f}' for c in r['shard_cpu'])} | "
                f"{' / '.join(f'{c:.0f}' for c in r['shard_wait'])} | {r['client_cpu']:.0f} | "
                f"{r['load'][0]:.1f} / {r['load'][1]:.1f} | {target} |")
        samples = [s for r in shards for s in r["error_samples"]]
        if samples:
            lines += ["", "Errors seen (first few):", ""] + [f"- `{s}`" for s in samples]
        lines.append("")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="overhead,shards", help="overhead, shards or both")
    ap.add_argument("--overhead-rollouts", type=int, default=32)
    ap.add_argument("--overhead-repeats", type=int, default=1)
    ap.add_argument("--shards", default="1,2,4", help="shard counts, e.g. 1,2,4")
    ap.add_argument("--rollouts", type=int, default=1000, help="open rollouts at once")
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    ap.add_argument("--tokens", type=int, default=200, help="tokens per reply")
    ap.add_argument("--rate", type=float, default=5.0, help="tokens/s per stream")
    ap.add_argument("--min-turns", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=12)
    ap.add_argument("--think", type=float, default=3.0, help="pause between calls, s")
    ap.add_argument("--stagger", type=float, default=30.0, help="spread of the starts, s")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=HERE / "ray_scale.md")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path[:0] = PATHS
    parts = set(args.parts.split(","))
    overhead = measure_overhead(args) if "overhead" in parts else None
    shards = []
    if "shards" in parts:
        with tempfile.TemporaryDirectory(prefix="hrl-shards-") as work:
            for count in (int(c) for c in args.shards.split(",")):
                print(f"{count} shards, {args.rollouts} open rollouts, {args.duration:g} s",
                      flush=True)
                shards.append(measure_shards(args, count, Path(work)))
    report = render(args, overhead, shards)
    args.out.write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
