"""Measure what the harnessrl capture proxy adds over calling the engine directly.

One command starts the shared fake engine (`bench_engine.py`) and a fresh `harnessrl serve`
per phase, drives them with the shared `proxy_bench.py` (both run from the shared tools
folder, never copied), and checks the figures against the proxy's targets:

  cells    chat dialect at c = 1, 16, 64, non-streamed and streamed, proxy vs direct, with
           the ANCHOR_BENCH workload (~4,000-token prompt, 4 tools, engine 200 tokens x 5 ms)
  floor    the same at c = 1 and 16 with engine delay 0 and n = 200: a call takes a few ms,
           so the proxy's added time is not lost in the 1 s generation's jitter
  profile  py-spy on the proxy during a c=16 non-streamed and a c=16 streamed run
           (only with --profile; needs py-spy in the venv)
  soak     10,000 non-streamed turns at c=16, engine delay 0, RSS at 1k / 5k / 10k
  idle     RSS per idle open rollout (POST /rollouts N times)

    .venv/bin/python bench/proxy/proxy_overhead.py [--quick] [--profile] [--dialects all]
                                             [--out bench/proxy/proxy.md]

The Markdown report goes to --out; the raw proxy_bench JSON and the logs stay in the work
directory when --keep is given (or when a phase fails).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
DEFAULT_TOOLS = HERE.parents[2] / "shared" / "tools"
PHASES = ("cells", "floor", "profile", "soak", "idle")
ENGINE_TOKENS, ENGINE_DELAY_MS = 200, 5
FLAT_MEMORY_MIB = 10.0  # allowed RSS growth between the first and the last soak checkpoint
BOX_BOUND_C = 64  # ANCHOR_BENCH observation 5: on 2 cores c=64 measures the box, not the proxy


@dataclass(frozen=True)
class Sizes:
    """How much work each phase does."""

    min_requests: int  # per target per cell: max(min_requests, rounds * c), as in proxy_bench
    rounds: int
    soak: tuple[int, ...]
    idle_rollouts: int
    profile_turns: int
    idle_seconds: float  # how long the proxy's idle CPU is measured
    floor_requests: int


FULL = Sizes(min_requests=20, rounds=4, soak=(1000, 5000, 10000), idle_rollouts=5000,
             profile_turns=3000, idle_seconds=15.0, floor_requests=200)
QUICK = Sizes(min_requests=8, rounds=1, soak=(250, 500, 1000), idle_rollouts=1000,
              profile_turns=600, idle_seconds=5.0, floor_requests=50)


# ------------------------------------------------------------------ processes
class Service:
    """A child process with its output in a log file; stopped by its own pid only."""

    def __init__(self, name: str, argv: list[str], log: Path) -> None:
        self.name, self.log = name, log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(check: Any, service: Service, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service.alive():
            raise RuntimeError(f"{service.name} exited while {what}:\n{service.tail()}")
        with contextlib.suppress(httpx.HTTPError, OSError):
            if (found := check()) is not None:
                return found
        time.sleep(0.1)
    raise RuntimeError(f"timed out {what}:\n{service.tail()}")


def start_engine(tools: Path, work: Path) -> tuple[Service, str]:
    argv = [sys.executable, str(tools / "bench_engine.py"), "--port", "0",
            "--tokens", str(ENGINE_TOKENS), "--delay-ms", str(ENGINE_DELAY_MS)]
    engine = Service("bench_engine", argv, work / "engine.log")

    def ready() -> int | None:
        match = re.search(r"READY (\d+)", engine.log.read_text(errors="replace"))
        return int(match.group(1)) if match else None

    port = wait_for(ready, engine, "waiting for READY")
    return engine, f"http://127.0.0.1:{port}"


def harnessrl_argv() -> list[str]:
    script = Path(sys.executable).parent / "harnessrl"
    return [str(script)] if script.exists() else [sys.executable, "-m", "harnessrl.cli"]


def start_proxy(engine_url: str, work: Path, name: str) -> tuple[Service, str]:
    port, run_dir = free_port(), work / f"run-{name}"
    argv = [*harnessrl_argv(), "serve", "--engine-url", engine_url, "--run-dir", str(run_dir),
            "--port", str(port), "--workers", "1"]  # one process: its CPU is the figure
    proxy = Service(f"proxy ({name})", argv, work / f"proxy-{name}.log")
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool | None:
        return True if httpx.get(f"{url}/health", timeout=2).status_code == 200 else None

    wait_for(healthy, proxy, "waiting for /health")
    return proxy, url


@contextlib.contextmanager
def running(service: Service) -> Iterator[Service]:
    try:
        yield service
    finally:
        service.stop()


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid`, in ns (schedstat: finer than the 10 ms ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/schedstat") as fh:
            total += int(fh.read().split()[0])
    return total


def idle_cpu_ms_per_s(pid: int, seconds: float) -> float:
    """What the proxy burns with no traffic (timers, loop ticks), in CPU ms per second."""
    c0, t0 = cpu_ns(pid), time.perf_counter()
    time.sleep(seconds)
    return (cpu_ns(pid) - c0) / 1e6 / (time.perf_counter() - t0)


# ------------------------------------------------------------------ proxy_bench runs
@dataclass
class Bench:
    """Everything a proxy_bench run needs to know about the services."""

    tools: Path
    engine_url: str
    work: Path
    dialects: str = "chat"  # proxy_bench's --dialect: a comma list or "all"

    def argv(self, proxy_url: str, pid: int, out: Path, extra: Sequence[str],
             delay_ms: float = ENGINE_DELAY_MS) -> list[str]:
        return [sys.executable, str(self.tools / "proxy_bench.py"),
                "--engine", f"{self.engine_url}/v1", "--proxy", f"{proxy_url}/r/{{key}}",
                "--mint", f"{proxy_url}/rollouts", "--mint-field", "key",
                "--proxy-pid", str(pid), "--dialect", self.dialects,
                "--engine-tokens", str(ENGINE_TOKENS), "--engine-delay-ms", f"{delay_ms:g}",
                "--json", str(out), *extra]

    def run(self, name: str, proxy_url: str, pid: int, extra: Sequence[str],
            delay_ms: float = ENGINE_DELAY_MS) -> dict[str, Any]:
        out, log = self.work / f"{name}.json", self.work / f"{name}.log"
        argv = self.argv(proxy_url, pid, out, extra, delay_ms)
        print(f"\n== {name}: {' '.join(argv[1:])}", flush=True)
        with log.open("w") as fh, subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
            assert proc.stdout is not None
            echo = True  # proxy_bench's closing summary repeats the rows: not echoed
            for line in proc.stdout:
                fh.write(line)
                echo = echo and not line.startswith("## Results")
                if echo:
                    print(f"   {line}", end="", flush=True)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"proxy_bench {name} failed (exit {proc.returncode}); see {log}")
        return json.loads(out.read_text())


# ------------------------------------------------------------------ statistics
def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (p99 of 20 samples is the max)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else float("nan")


@dataclass
class Cell:
    """One (mode, concurrency) cell of proxy_bench's raw output."""

    mode: str
    conc: int
    n: int
    direct: dict[str, Any]
    proxy: dict[str, Any]
    client_cpu: str = ""
    dialect: str = "chat"

    def ms(self, side: str, metric: str, q: float) -> float:
        return pct(getattr(self, side)[metric], q) * 1000

    def added(self, metric: str, q: float = 50) -> float:
        return self.ms("proxy", metric, q) - self.ms("direct", metric, q)

    def rps(self, side: str) -> float:
        data = getattr(self, side)
        return len(data["total"]) / data["wall"] if data["wall"] else float("nan")

    @property
    def calls(self) -> int:
        return len(self.proxy["total"]) + self.proxy["errors"]

    @property
    def cpu_ms(self) -> float:
        """Proxy CPU per call as proxy_bench measured it (10 ms ticks, idle cost included)."""
        return self.proxy["cpu_s"] / self.calls * 1000 if self.calls else float("nan")

    def net_cpu_ms(self, idle_ms_per_s: float) -> float:
        """Per-call CPU less what the proxy burns idle over the same wall time."""
        if not self.calls or math.isnan(idle_ms_per_s):
            return float("nan")
        return self.cpu_ms - idle_ms_per_s * self.proxy["wall"] / self.calls


def cells_from(raw: dict[str, Any]) -> list[Cell]:
    client = {}
    for row in raw["rows"]:
        if row[3] == "req/s":
            found = re.search(r"bench client CPU (.*)$", str(row[11]))
            client[(row[0], row[1], int(row[2]))] = found.group(1) if found else ""
    return [Cell(c["mode"], c["concurrency"], c["n"], c["direct"], c["proxy"],
                 client.get((c["dialect"], c["mode"], c["concurrency"]), ""),
                 c.get("dialect", "chat")) for c in raw["raw"]]


def find(cells: list[Cell], mode: str, conc: int, dialect: str = "chat") -> Cell | None:
    return next((c for c in cells if c.mode == mode and c.conc == conc
                 and c.dialect == dialect), None)


def dialects_of(cells: list[Cell]) -> list[str]:
    return list(dict.fromkeys(c.dialect for c in cells))


# ------------------------------------------------------------------ phases
@dataclass
class Report:
    sizes: Sizes
    cells: list[Cell] = field(default_factory=list)
    floor: list[Cell] = field(default_factory=list)
    soak: list[list[Any]] = field(default_factory=list)
    soak_rss_before: float = float("nan")
    idle_cpu: float = float("nan")  # proxy CPU ms per second with no traffic
    idle: dict[str, float] = field(default_factory=dict)
    profiles: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    source: str = ""


def phase_cells(bench: Bench, report: Report, concurrency: str) -> None:
    proxy, url = start_proxy(bench.engine_url, bench.work, "cells")
    with running(proxy):
        print(f"\n== idle CPU of the fresh proxy over {report.sizes.idle_seconds:g} s",
              flush=True)
        report.idle_cpu = idle_cpu_ms_per_s(proxy.pid, report.sizes.idle_seconds)
        rss0 = rss_mib(proxy.pid)
        raw = bench.run("cells", url, proxy.pid, [
            "--modes", "json,sse", "--concurrency", concurrency,
            "--min-requests", str(report.sizes.min_requests),
            "--rounds", str(report.sizes.rounds)])
        rss1 = rss_mib(proxy.pid)
    report.cells = cells_from(raw)
    sent = sum(c.calls for c in report.cells)
    report.notes.append(f"cells: proxy RSS {fmt(rss0)} MiB at start, {fmt(rss1)} MiB after "
                        f"{sent} measured turns (+ warm-up)")
    report.notes.append(f"cells: idle proxy CPU {fmt(report.idle_cpu, 2)} ms per second "
                        "(fresh proxy, before any traffic); 'net' CPU per call subtracts it")
    report.notes += store_check("cells", bench.work / "run-cells", proxy)


def phase_floor(bench: Bench, report: Report) -> None:
    proxy, url = start_proxy(bench.engine_url, bench.work, "floor")
    with running(proxy):
        raw = bench.run("floor", url, proxy.pid, [
            "--modes", "json,sse", "--concurrency", "1,16",
            "--requests", str(report.sizes.floor_requests)], delay_ms=0)
    report.floor = cells_from(raw)
    report.notes += store_check("floor", bench.work / "run-floor", proxy)


def phase_soak(bench: Bench, report: Report) -> None:
    proxy, url = start_proxy(bench.engine_url, bench.work, "soak")
    with running(proxy):
        report.soak_rss_before = rss_mib(proxy.pid)
        raw = bench.run("soak", url, proxy.pid, [
            "--modes", "none", "--soak", ",".join(map(str, report.sizes.soak)),
            "--soak-concurrency", "16", "--soak-engine-delay-ms", "0"])
    report.soak = raw["soak"]
    report.notes += store_check("soak", bench.work / "run-soak", proxy)


def phase_idle(bench: Bench, report: Report, warmup: int = 200) -> None:
    proxy, url = start_proxy(bench.engine_url, bench.work, "idle")
    count = report.sizes.idle_rollouts
    print(f"\n== idle: {count} rollouts via POST {url}/rollouts", flush=True)
    with running(proxy), httpx.Client(timeout=30) as http:
        for _ in range(warmup):  # first allocations (imports, caches) are not per rollout
            http.post(f"{url}/rollouts", json={}).raise_for_status()
        before, t0 = rss_mib(proxy.pid), time.perf_counter()
        for _ in range(count):
            http.post(f"{url}/rollouts", json={}).raise_for_status()
        elapsed, after = time.perf_counter() - t0, rss_mib(proxy.pid)
        open_now = http.get(f"{url}/health").json().get("open_rollouts")
    report.idle = {"count": count, "before": before, "after": after,
                   "kib_each": (after - before) * 1024 / count, "per_s": count / elapsed,
                   "open": float(open_now or 0)}
    print(f"   RSS {fmt(before)} -> {fmt(after)} MiB: "
          f"{fmt(report.idle['kib_each'], 2)} KiB per rollout", flush=True)


# ------------------------------------------------------------------ profile
def phase_profile(bench: Bench, report: Report) -> None:
    local = Path(sys.executable).parent / "py-spy"
    spy = str(local) if local.exists() else shutil.which("py-spy")
    if spy is None:
        report.notes.append("profile: skipped, py-spy is not installed in the venv")
        return
    proxy, url = start_proxy(bench.engine_url, bench.work, "profile")
    runs = {
        "json c=16 (engine delay 0)": ["--modes", "none", "--soak",
                                       str(report.sizes.profile_turns),
                                       "--soak-concurrency", "16", "--soak-engine-delay-ms", "0"],
        "sse c=16": ["--modes", "sse", "--concurrency", "16", "--requests", "128"],
    }
    with running(proxy):
        for i, (label, extra) in enumerate(runs.items()):
            out = bench.work / f"profile-{i}.txt"
            argv = [spy, "record", "--pid", str(proxy.pid), "--rate", "400", "--threads",
                    "--gil", "--nonblocking", "--format", "raw", "-o", str(out)]
            with running(Service(f"py-spy {label}", argv, bench.work / f"py-spy-{i}.log")):
                time.sleep(1.0)  # let py-spy attach
                bench.run(f"profile-{i}", url, proxy.pid, extra)
            report.profiles[label] = hotspots(out) if out.exists() else ["(no profile written)"]


@dataclass
class Tally:
    """py-spy samples counted by leaf frame, by harnessrl frame on the stack, by package."""

    own: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)
    packages: Counter[str] = field(default_factory=Counter)
    total: int = 0

    def add(self, frames: list[str], count: int) -> None:
        self.total += count
        leaf = _frame(frames[-1]) if frames else "(no Python frame)"
        self.own[leaf] += count
        self.packages[leaf.split("/")[0].split(":")[0].removesuffix(".py")] += count
        for frame in {_frame(f) for f in frames if "harnessrl/" in f and "harnessrl/cli" not in f}:
            self.inclusive[frame] += count


def hotspots(path: Path, top: int = 12) -> list[str]:
    """Self, inclusive and per-package shares from py-spy's raw (collapsed) stacks."""
    tally = Tally()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            tally.add(stack.split(";")[1:], int(count))  # [0] is the thread
    if not tally.total:
        return ["(no samples)"]

    def share(counter: Counter[str], n: int) -> list[str]:
        return [f"  {100 * k / tally.total:5.1f}%  {f}" for f, k in counter.most_common(n)]

    return [f"{tally.total} samples of the GIL holder at 400 Hz "
            f"({tally.total / 400:.1f} s of Python-holding time)", "", "by package (self):",
            *share(tally.packages, 8), "", "self time:", *share(tally.own, top), "",
            "inclusive time, harnessrl frames:", *share(tally.inclusive, top)]


def _frame(raw: str) -> str:
    """`func (path/to/file.py:12)` -> `file.py:func`, keeping `harnessrl/...` paths."""
    match = re.match(r"(.*) \((.*?)(?::\d+)?\)$", raw)
    if not match:
        return raw
    func, path = match.groups()
    cut = path.find("harnessrl/")
    short = path[cut:] if cut >= 0 else "/".join(Path(path).parts[-2:]).lstrip("/")
    return f"{short}:{func}"


# ------------------------------------------------------------------ sanity checks
def store_check(name: str, run_dir: Path, proxy: Service) -> list[str]:
    """What the proxy recorded, and anything alarming in its log."""
    notes = []
    db_path = run_dir / "trace.db"
    if db_path.exists():
        with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:
            status = dict(db.execute("SELECT status, COUNT(*) FROM turns GROUP BY status"))
            flagged = db.execute("SELECT CAST(flags AS TEXT) f, COUNT(*) FROM turns "
                                 "WHERE f != '[]' GROUP BY f").fetchall()
            turns = sum(status.values())
        size = sum(p.stat().st_size for p in run_dir.glob("trace.db*"))
        notes.append(f"{name}: trace.db turns by status {status}; capture flags "
                     f"{flagged or 'none'}; {size / max(turns, 1) / 1024:,.1f} KiB on disk "
                     "per turn")
    log = proxy.log.read_text(errors="replace")
    bad = [ln for ln in log.splitlines() if re.search(r"Traceback|ERROR|Exception", ln)]
    if bad:
        notes.append(f"{name}: proxy log has {len(bad)} error lines, e.g. {bad[:3]}")
    return notes


# ------------------------------------------------------------------ targets
@dataclass(frozen=True)
class Check:
    target: str
    where: str
    measured: float
    limit: float
    unit: str
    detail: str = ""

    @property
    def verdict(self) -> str:
        if math.isnan(self.measured):
            return "n/a"
        return "PASS" if self.measured <= self.limit else "FAIL"


def _where(cell: Cell, workload: str) -> str:
    dialect = "" if cell.dialect == "chat" else f"{cell.dialect} "
    return (f"{workload}: {dialect}{'streamed' if cell.mode == 'sse' else 'non-streamed'} "
            f"c={cell.conc}")


def latency_checks(cells: list[Cell], workload: str, concurrency: Sequence[int]) -> list[Check]:
    """Added TTFT (streamed) and added latency (non-streamed), p50, at the given c."""
    out: list[Check] = []
    for dialect in dialects_of(cells):
        out += _latency_checks(cells, workload, concurrency, dialect)
    return out


def _latency_checks(cells: list[Cell], workload: str, concurrency: Sequence[int],
                    dialect: str) -> list[Check]:
    out: list[Check] = []
    for conc in concurrency:
        if cell := find(cells, "sse", conc, dialect):
            out.append(Check("TTFT added (p50) ≤ 2 ms", _where(cell, workload),
                             cell.added("ttft"), 2.0, "ms"))
    for conc in concurrency:
        limit = 2.0 if conc == 1 else 5.0
        if cell := find(cells, "json", conc, dialect):
            out.append(Check(f"latency added (p50) ≤ {limit:g} ms", _where(cell, workload),
                             cell.added("total"), limit, "ms",
                             f"n={cell.n}; added p99 {fmt(cell.added('total', 99), 1)} ms"))
    return out


def cpu_checks(cells: list[Cell], workload: str, idle_cpu: float) -> list[Check]:
    return [Check("proxy CPU ≤ 1.5 ms/call (net of idle)", _where(cell, workload),
                  cell.net_cpu_ms(idle_cpu), 1.5, "ms", f"gross {fmt(cell.cpu_ms, 2)} ms")
            for cell in cells if cell.conc < BOX_BOUND_C]


def memory_checks(report: Report) -> list[Check]:
    out: list[Check] = []
    if report.soak:
        first, last = report.soak[0], report.soak[-1]
        out.append(Check("proxy CPU ≤ 1.5 ms/call (gross)", f"soak: segment ending at "
                         f"{last[0]:,} turns", _num(last[5]), 1.5, "ms", "engine delay 0"))
        out.append(Check(f"flat memory (RSS growth ≤ {FLAT_MEMORY_MIB:g} MiB)",
                         f"soak: {first[0]:,} → {last[0]:,} turns", _num(last[1]) - _num(first[1]),
                         FLAT_MEMORY_MIB, "MiB",
                         " / ".join(f"{r[1]} MiB at {r[0]:,}" for r in report.soak)))
    if report.idle:
        idle = report.idle
        out.append(Check("≤ 20 KB per idle rollout", f"idle: {idle['count']:,.0f} rollouts",
                         idle["kib_each"] * 1.024, 20.0, "KB",
                         f"RSS {fmt(idle['before'])} → {fmt(idle['after'])} MiB"))
    return out


def checks(report: Report) -> list[Check]:
    anchor, floor = "anchor (5 ms/token)", "delay 0"
    return [*latency_checks(report.cells, anchor, (1, 16)),
            *latency_checks(report.floor, floor, (1,)),
            *cpu_checks(report.cells, anchor, report.idle_cpu),
            *cpu_checks(report.floor, floor, report.idle_cpu),
            *memory_checks(report)]


def _num(text: Any) -> float:
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return float("nan")


# ------------------------------------------------------------------ rendering
def md_table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]


def cell_rows(cell: Cell, idle_cpu: float) -> list[list[str]]:
    metrics = [("TTFT ms", "ttft"), ("total ms", "total")] if cell.mode == "sse" else [
        ("latency ms", "total")]
    rows = []
    for label, key in metrics:
        d50, d99 = cell.ms("direct", key, 50), cell.ms("direct", key, 99)
        p50, p99 = cell.ms("proxy", key, 50), cell.ms("proxy", key, 99)
        rows.append([cell.dialect, cell.mode, cell.conc, cell.n, label, fmt(d50), fmt(d99),
                     fmt(p50), fmt(p99),
                     fmt(ratio(p50, d50), 2), fmt(ratio(p99, d99), 2), fmt(p50 - d50),
                     fmt(p99 - d99)])
    drps, prps = cell.rps("direct"), cell.rps("proxy")
    net = cell.net_cpu_ms(idle_cpu)
    rows.append([cell.dialect, cell.mode, cell.conc, cell.n, "req/s", fmt(drps, 2), "",
                 fmt(prps, 2), "",
                 fmt(ratio(prps, drps), 2), "",
                 f"proxy CPU {fmt(cell.cpu_ms, 2)} ms/call (net {fmt(net, 2)})",
                 f"errors d={cell.direct['errors']} p={cell.proxy['errors']}; "
                 f"client CPU {cell.client_cpu}"])
    return rows


def render(report: Report, command: str) -> str:
    lines = [f"# Proxy overhead: harnessrl vs direct engine ({time.strftime('%Y-%m-%d %H:%M')})",
             "", f"Command: `{command}`", "", machine_line(), "",
             f"harnessrl source: {report.source}", "",
             "Workload (as ANCHOR_BENCH): chat dialect, ~4,000-token prompt, 4 tools, "
             f"max_tokens 256, engine {ENGINE_TOKENS} tokens x {ENGINE_DELAY_MS} ms, "
             "50 turns per minted rollout, 2 alternating proxy/direct blocks per cell.", "",
             "## Targets", ""]
    lines += md_table(("target", "where", "measured", "verdict", "detail"), [
        (c.target, c.where, f"{fmt(c.measured, 2)} {c.unit}", f"**{c.verdict}**", c.detail)
        for c in checks(report)])
    lines += render_cells(report)
    lines += render_floor(report)
    lines += render_memory(report)
    for label, hot in report.profiles.items():
        lines += ["", f"## Profile: {label}", "", "```", *hot, "```"]
    if report.notes:
        lines += ["", "## Notes", "", *[f"- {n}" for n in report.notes]]
    return "\n".join(lines) + "\n"


CELL_HEAD = ("dialect", "mode", "c", "n", "metric", "direct p50", "direct p99", "proxy p50",
             "proxy p99", "ratio p50", "ratio p99", "added p50 ms", "added p99 ms")


def render_floor(report: Report) -> list[str]:
    if not report.floor:
        return []
    rows = [r for c in report.floor for r in cell_rows(c, report.idle_cpu)]
    return ["", "## Latency floor (engine delay 0: 200 tokens at once)", "",
            *md_table(CELL_HEAD, rows), "",
            "With the generation taking no time, a call lasts a few ms and the proxy's own time "
            "stands out of the jitter; c=16 here loads the box (see client CPU)."]


def render_cells(report: Report) -> list[str]:
    if not report.cells:
        return []
    rows = [r for c in report.cells for r in cell_rows(c, report.idle_cpu)]
    return ["", "## Proxy vs direct (anchor workload)", "", *md_table(CELL_HEAD, rows), "",
            f"c={BOX_BOUND_C} rows measure the 2-core box (client, engine and proxy share it; "
            "ANCHOR_BENCH observation 5) and are not judged. Proxy CPU is utime+stime of the "
            "proxy process in 10 ms ticks (coarse at c=1); 'net' subtracts the proxy's idle "
            "CPU over the cell's wall time. Client CPU is the bench client's own share per "
            "side (d=direct, p=proxy): near 100% means the client, not the proxy, limits."]


def render_memory(report: Report) -> list[str]:
    lines: list[str] = []
    if report.soak:
        lines += ["", "## Soak (fresh proxy, chat non-streamed, c=16, engine delay 0)", "",
                  f"RSS before the first turn: {fmt(report.soak_rss_before)} MiB", ""]
        lines += md_table(("turns", "RSS MiB", "req/s (segment)", "p50 ms", "p99 ms",
                           "proxy CPU ms/call", "errors"), report.soak)
    if report.idle:
        i = report.idle
        lines += ["", "## Idle rollouts (fresh proxy)", ""]
        lines += md_table(("rollouts", "RSS before MiB", "RSS after MiB", "KiB per rollout",
                           "created/s", "open per /health"),
                          [(f"{i['count']:,.0f}", fmt(i["before"]), fmt(i["after"]),
                            fmt(i["kib_each"], 2), fmt(i["per_s"], 0), f"{i['open']:,.0f}")])
    return lines


def source_state() -> str:
    """The harnessrl source measured: git HEAD and how many files under src/ differ from it."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", "-C", str(HERE.parents[1]), *argv], capture_output=True,
                              text=True, check=True).stdout

    try:
        head, dirty = git("rev-parse", "--short", "HEAD").strip(), git("status", "--porcelain",
                                                                        "src").splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (f" + {len(dirty)} uncommitted file(s) under src/" if dirty else "")


def machine_line() -> str:
    model = ""
    with contextlib.suppress(OSError):
        found = re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())
        model = found.group(1) if found else ""
    return (f"Machine: {os.cpu_count()} cores ({model}), Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")


def print_summary(report: Report) -> None:
    print("\n== targets")
    for c in checks(report):
        print(f"   {c.verdict:4}  {c.target:38} {c.where:40} {fmt(c.measured, 2):>7} {c.unit}"
              f"  {c.detail}")


# ------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small n everywhere: a fast check")
    ap.add_argument("--out", type=Path, default=HERE / "proxy.md", help="Markdown report")
    ap.add_argument("--phases", default="cells,floor,soak,idle",
                    help=f"comma list of {', '.join(PHASES)} (profile needs py-spy)")
    ap.add_argument("--profile", action="store_true", help="add the profile phase")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--dialects", default="chat",
                    help="chat, responses, anthropic, gemini: a comma list, or all")
    ap.add_argument("--tools-dir", type=Path,
                    default=Path(os.environ.get("HARNESSRL_BENCH_TOOLS", DEFAULT_TOOLS)),
                    help="folder holding bench_engine.py and proxy_bench.py")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args(argv)
    args.phases = [p for p in args.phases.split(",") if p]
    if args.profile and "profile" not in args.phases:
        args.phases.append("profile")
    unknown = set(args.phases) - set(PHASES)
    if unknown:
        ap.error(f"unknown phases {sorted(unknown)}")
    return args


def run_phases(args: argparse.Namespace, work: Path, report: Report) -> None:
    engine, engine_url = start_engine(args.tools_dir, work)
    with running(engine):
        bench = Bench(args.tools_dir, engine_url, work, args.dialects)
        runners = {"cells": lambda: phase_cells(bench, report, args.concurrency),
                   "floor": lambda: phase_floor(bench, report),
                   "profile": lambda: phase_profile(bench, report),
                   "soak": lambda: phase_soak(bench, report),
                   "idle": lambda: phase_idle(bench, report)}
        for phase in args.phases:
            runners[phase]()


def measure(argv: list[str] | None = None) -> Report:
    """Run the phases, write the Markdown report to --out; raises RuntimeError on failure."""
    args = parse_args(argv)
    for tool in ("bench_engine.py", "proxy_bench.py"):
        if not (args.tools_dir / tool).exists():
            raise RuntimeError(f"no {tool} in {args.tools_dir}; pass --tools-dir")
    report = Report(QUICK if args.quick else FULL, source=source_state())
    work = Path(tempfile.mkdtemp(prefix="harnessrl-bench-"))
    print(f"work directory: {work}", flush=True)
    keep = args.keep
    try:
        run_phases(args, work, report)
    except (RuntimeError, httpx.HTTPError) as exc:
        keep = True
        raise RuntimeError(f"benchmark failed: {exc}\n(logs kept in {work})") from exc
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    if (now := source_state()) != report.source:
        report.notes.append(f"the source changed during the run: {report.source} → {now}")
    command = " ".join([Path(sys.executable).name, *sys.argv]) if argv is None else str(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(report, command))
    print_summary(report)
    print(f"\nreport written to {args.out}")
    return report


def main(argv: list[str] | None = None) -> int:
    try:
        measure(argv)
    except RuntimeError as exc:
        print(f"\n{exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
