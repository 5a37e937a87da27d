#!/usr/bin/env python3
"""Every benchmark in one command, each figure against its baseline from the same run, into
one Markdown file (bench/results.md) that the docs site's Benchmarks page includes.

    .venv/bin/python bench/run.py            # about 10 minutes: short load, quick proxy cells
    .venv/bin/python bench/run.py --full     # adds the 10-minute load and the full proxy run
    .venv/bin/python bench/run.py --full=load    # only the load at full length (10 minutes)
    .venv/bin/python bench/run.py --only samples,load

Sections come from SECTIONS below: a title, a module in a bench/ group folder (proxy/,
store/, rollouts/, train/) and its arguments. A module gives its rows through `rows(argv)`
(a list of `table.Row`); a module with only `run(argv)` or `main(argv)` is run as is, and
what it prints (Markdown) is kept under the table. A section whose file is missing is
skipped with a note; one that fails is reported as failed, and the others still run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "common"))  # table.py; each section puts its own folder on the path

from table import Row, machine_line, md_table  # noqa: E402


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    module: str  # bench/<group>/<module>.py, without the .py
    quick: tuple[str, ...] = ()
    full: tuple[str, ...] = ()
    adapter: Callable[[ModuleType, list[str]], list[Row]] | None = None
    note: str = ""  # how to read its rows, printed under the table
    details: tuple[str, str] = ("", "")  # the file it writes its own report to: quick, full


def proxy_rows(module: ModuleType, argv: list[str]) -> list[Row]:
    """Added latency per dialect and mode (proxy p50 minus the direct engine's p50)."""
    report = module.measure(argv)
    rows = []
    for workload, cells in (("engine delay 0", report.floor), ("anchor, 5 ms/token",
                                                               report.cells)):
        for dialect in module.dialects_of(cells):
            for mode in ("json", "sse"):
                if row := _proxy_row(module, cells, workload, dialect, mode):
                    rows.append(row)
    for workload, cells in (("engine delay 0", report.floor), ("5 ms/token", report.cells)):
        rows += _cpu_rows(module, cells, workload)
    checks = {(c.target, c.where): c for c in module.checks(report)}
    rows += [Row(f"{c.target}: {c.where}", f"{c.measured:,.2f} {c.unit}", c.detail, "",
                 c.verdict) for c in checks.values() if "memory" in c.target
             or "idle rollout" in c.target]
    return rows


def _cpu_rows(module: ModuleType, cells: list[Any], workload: str) -> list[Row]:
    """Proxy CPU per streamed token and per non-streamed call, per dialect (proxy_bench's
    figure: the proxy process's CPU over the cell's calls, 10 ms ticks, idle included)."""
    tokens = module.ENGINE_TOKENS
    rows = []
    for dialect in module.dialects_of(cells):
        for mode, unit, target in (("sse", "µs/token", 15.0), ("json", "ms/call", 1.5)):
            found = [c for c in (module.find(cells, mode, conc, dialect) for conc in (1, 16))
                     if c]
            if not found:
                continue
            per = {c.conc: c.cpu_ms * 1000 / tokens if mode == "sse" else c.cpu_ms
                   for c in found}
            shown = ", ".join(f"c={k} {v:.1f}" if mode == "sse" else f"c={k} {v:.2f}"
                              for k, v in per.items())
            direct = ", ".join(f"c={c.conc} {c.ms('direct', 'total', 50):.1f}" for c in found)
            what = "streamed token" if mode == "sse" else "non-streamed call"
            rows.append(Row(f"proxy CPU per {what}, {dialect} ({tokens}-token replies, "
                            f"{workload}): {unit}", shown,
                            f"the engine called directly: p50 total {direct} ms per call",
                            f"≤ {target:g}",
                            "PASS" if per.get(1, math.inf) <= target else "FAIL"))
    return rows


def _proxy_row(module: ModuleType, cells: list[Any], workload: str, dialect: str,
               mode: str) -> Row | None:
    found = [c for c in (module.find(cells, mode, conc, dialect) for conc in (1, 16)) if c]
    if not found:
        return None
    metric = "ttft" if mode == "sse" else "total"
    label = "TTFT" if mode == "sse" else "latency"
    added = ", ".join(f"c={c.conc} {c.added(metric):+.1f}" for c in found)
    direct = ", ".join(f"c={c.conc} {c.ms('direct', metric, 50):.1f}" for c in found)
    limits = {c.conc: 2.0 if mode == "sse" or c.conc == 1 else 5.0 for c in found}
    ok = all(c.added(metric) <= limits[c.conc] for c in found)
    cpu = ", ".join(f"{c.cpu_ms:.1f}" for c in found)
    return Row(f"proxy overhead, {dialect} {'streamed' if mode == 'sse' else 'non-streamed'} "
               f"({workload}): {label} added p50, ms", f"{added} (proxy CPU/call {cpu} ms)",
               f"direct engine p50 {direct} ms",
               " / ".join(f"c={k} ≤ {v:g}" for k, v in limits.items()),
               "PASS" if ok else "FAIL")


SECTIONS: tuple[Section, ...] = (
    Section("proxy", "proxy overhead, four dialects (vs the engine called directly)",
            "proxy/proxy_overhead",
            ("--quick", "--phases", "floor", "--dialects", "all", "--out", "bench/proxy/proxy.md"),
            ("--phases", "cells,floor,soak,idle", "--concurrency", "1,16", "--dialects", "all",
             "--out", "bench/proxy/proxy.md"), proxy_rows,
            "each dialect is called through its own SDK (openai, anthropic, google-genai) and "
            "the engine directly through the openai SDK, so a dialect's added time includes "
            "its SDK's own cost; on 2 shared cores c=16 rows vary by tens of ms run to run",
            ("bench/proxy/proxy.md", "bench/proxy/proxy.md")),
    Section("stream_cpu", "proxy CPU per streamed token and per call (vs the proxy before "
            "issue 19, three byte-copying relays and the reference proxy, same run)",
            "proxy/stream_cpu",
            ("--blocks", "4", "--calls", "4", "--paced", "20,50,100"),
            ("--blocks", "8", "--calls", "6", "--paced", "20,50,100"),
            note="this proxy (as served by default, and with `--stream-interval-ms` 20, 50 "
                 "and 100: the engine's stream read at most once per interval; its 400 ms "
                 "streams are a multiple of each, so the reply time barely grows here, "
                 "where in general the last token waits up to the interval), the one before "
                 "issue 19, three relays that only copy the engine's "
                 "bytes (bench/proxy/floor_relay.py: raw asyncio, and a bare ASGI app under "
                 "uvicorn: the floor under any Python proxy here; and socat, in C, passing "
                 "on the proxy's own engine request: the floor under a relay in any "
                 "language, what the kernel and the VM charge for a read and a write) and "
                 "the reference proxy "
                 "(openenv 0.10.0's capture server, its own venv) side by side on one fake "
                 "vLLM (2 ms/token streamed; 0 ms/token streamed, the engine ahead of the "
                 "proxy; 0 ms non-streamed), requests alternating "
                 "between them in blocks; CPU from /proc schedstat. The reference asks for "
                 "the whole reply and replays it as one event, so its streamed figure is a "
                 "call's, not a stream's. On 2 shared cores the absolute µs move by 2x "
                 "between runs; the ratios are the figures"),
    Section("stream_path", "the proxy's own CPU per streamed token, no sockets (vs the proxy "
            "before issue 19, same run)", "proxy/stream_path",
            ("--calls", "5", "--rounds", "2", "--repeats", "2"),
            ("--calls", "10", "--rounds", "3", "--repeats", "3"),
            note="the real app driven by raw ASGI calls, the engine's answer replayed from "
                 "recorded vLLM SSE bytes (one read per token): what the proxy's own code "
                 "costs, without uvicorn, the socket reads and the kernel"),
    Section("latency", "latency and time to first token added at c=1, one raw HTTP client "
            "for every side (vs the engine called directly, same run)", "proxy/latency",
            ("--calls", "60"), ("--calls", "200"),
            note="the same aiohttp loop calls the engine directly (chat) and each dialect "
                 "through the proxy, calls interleaved, so no SDK's cost is in the figure "
                 "(the proxy section's are through each dialect's SDK)"),
    Section("call_stages", "where a non-streamed 4k-token call's CPU goes, stage by stage "
            "(vs the whole call in-process, same run)", "proxy/call_stages", ("--repeats", "200"),
            ("--repeats", "1000"),
            note="each stage is the proxy's own function run on that call's real input; the "
                 "store's write is the row encoded on the caller's thread plus the writer "
                 "thread's commit, per turn; the rest of the whole "
                 "call (measured as stream_path does) is routing, ASGI and the event loop"),
    Section("rollout_memory", "memory per open rollout, idle and after 100 turns (vs the "
            "proxy's RSS after warm-up, same run)", "proxy/rollout_memory", ("--idle", "2000"),
            ("--idle", "10000", "--busy", "32"),
            note="RSS from /proc; the 100-turn figure is a second round's, after a first "
                 "round paid the allocator's high-water mark for the longest requests"),
    Section("workers", "req/s at saturation, instant engine: `serve --workers N` against one "
            "worker (same run)", "proxy/workers", ("--seconds", "8", "--warmup", "2"),
            ("--seconds", "20"),
            note="raw HTTP/1.1 keep-alive clients (32 connections, one rollout each) in the "
                 "bench's own process, an instant engine (load_server.py's) in every worker; "
                 "the client and "
                 "every other process on the machine share its cores, so the load average "
                 "is printed beside each figure"),
    Section("samples", "sample building (vs reading the same turns)", "store/sample_build",
            ("--turns", "10000"), ("--turns", "10000")),
    Section("store", "the trace store: schema v4's layout (every turn whole) vs v5's (what is "
            "new against an earlier turn), same run", "store/store",
            ("--repeats", "2", "--store-turns", "20000", "--old-store-turns", "5000"),
            ("--repeats", "3", "--store-turns", "100000", "--old-store-turns", "10000"),
            note="both layouts written by the same TraceStore (v4's through a subclass that "
                 "packs rows as v4 did); CPU per turn is the committing thread's CPU for one "
                 "turn committed alone (`_commit_here`), split into the row encoded before "
                 "the commit (outside the write lock) and the commit; the context rollout is "
                 "this repository's text tokenized by the tiny model's tokenizer (4,096 "
                 "ids); the many-turn store is scaled down from the issue's million turns "
                 "(v4 at ~200 KiB/turn would be ~200 GB): rates, not totals, are compared"),
    Section("rollouts", "rollout overhead (vs the agent's own time)", "rollouts/rollout_overhead",
            ("--rollouts", "32"), ("--rollouts", "64"),
            details=("bench/rollouts/rollouts.md", "bench/rollouts/rollouts.md")),
    Section("load", "load: 256 streaming rollouts, four dialects", "proxy/load",
            ("--duration", "60", "--out", "-"), ("--duration", "600"),
            note="a short run's memory is not judged: its warm-up is shorter than the longest "
                 "conversation; `--full=load` runs the 10 minutes (bench/proxy/load.md)",
            details=("", "bench/proxy/load.md")),
    Section("token_render", "token-mode render (vs a full re-render)", "proxy/token_render",
            ("--repeat", "3"), ()),
    Section("async_training", "the async trainer locally vs on a 2-node Ray cluster, and the "
            "hold per weight swap with 1 vs 2 vLLM servers (same run)", "train/async_training",
            ("--steps", "3", "--runs", "async,async-cluster", "--swaps", "6"),
            ("--steps", "6", "--runs", "sync,async,async-cluster", "--swaps", "12"),
            note="real `harnessrl train` runs (tiny model, mini-swe-agent, one vLLM) and a "
                 "2-raylet Ray cluster started on this machine; both raylets, both vLLM "
                 "servers and the trainer share its cores, so neither table measures "
                 "scale-out, and two reloads at once can only beat one after the other where "
                 "each server has cores of its own (about 5 minutes quick, 15 full)",
            details=("bench/train/async_training.md", "bench/train/async_training.md")),
    Section("long_runs", "a long run's checkpoint and eval pass (vs a training step, same "
            "run)", "train/long_runs", ("--steps", "6"), ("--steps", "6"),
            note="a real async `harnessrl train` (tiny model, the scripted agent of "
                 "tests/long_run_agent.py, a checkpoint every 2 steps, an eval pass every 3) "
                 "and SmolLM2-135M's optimizer step against its checkpoint (no vLLM)"),
    Section("ray_scale", "Ray: overhead per rollout (vs local) and open rollouts held by "
            "1, 2, 4 proxy shards", "rollouts/ray_scale",
            ("--shards", "1,4", "--rollouts", "200", "--duration", "60", "--stagger", "10"),
            ("--shards", "1,2,4", "--rollouts", "1000", "--duration", "600"),
            note="the quick run holds 200 open rollouts for 60 s; `--full=ray_scale` the "
                 "issue's 1,000 for 10 minutes per shard count (over 30 minutes)",
            details=("bench/rollouts/ray_scale.md", "bench/rollouts/ray_scale.md")),
)


@dataclass
class Outcome:
    section: Section
    rows: list[Row] = field(default_factory=list)
    printed: str = ""
    seconds: float = math.nan
    note: str = ""
    full: bool = False


def run_section(section: Section, full: bool) -> Outcome:
    """The section in a fresh interpreter: one section's imports, memory and garbage do not
    weigh on the next one's figures, and a crash loses only its own."""
    outcome = Outcome(section, full=full)
    if not (HERE / f"{section.module}.py").exists():
        outcome.note = f"skipped: bench/{section.module}.py is not there"
        return outcome
    argv = list(section.full if full else section.quick)
    print(f"\n=== {section.title}: bench/{section.module}.py {' '.join(argv)}", flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="harnessrl-run-") as tmp:
        answer = Path(tmp) / "rows.json"
        child = [sys.executable, __file__, "--child", section.key, "--answer", str(answer)]
        done = subprocess.run([*child, *(["--full"] if full else [])], check=False)
        if answer.exists():
            got = json.loads(answer.read_text())
            outcome.rows = [Row(**r) for r in got["rows"]]
            outcome.printed, outcome.note = got["printed"], got["note"]
        else:
            outcome.note = f"failed: the section's process exited with {done.returncode}"
    outcome.seconds = time.monotonic() - started
    return outcome


def child(section: Section, full: bool, answer: Path) -> int:
    argv = list(section.full if full else section.quick)
    rows: list[Row] = []
    printed = note = ""
    try:
        folder, name = section.module.split("/")
        sys.path.insert(0, str(HERE / folder))  # its siblings import each other by name
        module = importlib.import_module(name)
        if section.adapter is not None:
            rows = section.adapter(module, argv)
        elif hasattr(module, "rows"):
            rows = module.rows(argv)
        else:
            printed = _printed(module, argv)
    except Exception as exc:  # reported in the table; the other sections still run
        traceback.print_exc()
        note = f"failed: {type(exc).__name__}: {exc}".splitlines()[0][:300]
    answer.write_text(json.dumps({"rows": [dataclasses.asdict(r) for r in rows],
                                  "printed": printed, "note": note}))
    return 1 if note else 0


def _printed(module: ModuleType, argv: list[str]) -> str:
    """Run a module's own entry point, keeping (and echoing) what it prints."""
    entry = getattr(module, "run", None) or module.main
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        result = entry(argv)
    text = captured.getvalue()
    print(text)
    if isinstance(result, str):
        text += result
    if isinstance(result, int) and result != 0:
        raise RuntimeError(f"exited with {result}")
    return text.strip()


def render(outcomes: list[Outcome], command: str, loads: tuple[str, str]) -> str:
    lines = [f"# harnessrl benchmarks ({time.strftime('%Y-%m-%d %H:%M')} UTC)", "",
             f"Command: `{command}`. {machine_line()}. Source: {source_state()}. "
             f"Load average (1 min) {loads[0]} at the start, {loads[1]} at the end "
             "(the benchmarks' own processes count in it).", "",
             "Every figure is measured against its baseline in the same run.", ""]
    rows = [(o.section.key, r.figure, r.measured, r.baseline, r.target, r.verdict)
            for o in outcomes for r in o.rows]
    rows += [(o.section.key, o.section.title, o.note, "", "", "") for o in outcomes if o.note]
    rows += [(o.section.key, o.section.title, "see below", "", "", "")
             for o in outcomes if o.printed and not o.note]
    lines += md_table(("section", "figure", "measured", "baseline (same run)", "target",
                       "verdict"), rows)
    notes = [f"- {o.section.key}: {o.section.note}" for o in outcomes
             if o.section.note and o.rows]
    if notes:
        lines += ["", *notes]
    for o in outcomes:
        if o.printed and not o.note:
            note = [o.section.note, ""] if o.section.note else []
            lines += ["", f"## {o.section.title}", "", *note, o.printed]
    details = [f"`{path}`" for o in outcomes if (o.rows or o.printed)
               and (path := o.section.details[o.full])]
    timing = ", ".join(f"{o.section.key} {o.seconds:.0f} s" for o in outcomes
                       if not math.isnan(o.seconds))
    lines += ["", f"Details (same run): {', '.join(details) or 'none'}. "
                  f"Time per section: {timing}."]
    return "\n".join(lines) + "\n"


def source_state() -> str:
    def git(*argv: str) -> str:
        return subprocess.run(["git", "-C", str(HERE.parent), *argv], capture_output=True,
                              text=True, check=True).stdout.strip()

    try:
        dirty = git("status", "--porcelain", "src").splitlines()
        return git("rev-parse", "--short", "HEAD") + (
            f" + {len(dirty)} uncommitted file(s) under src/" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", nargs="?", const="all", default="",
                    help="full lengths (the 10-minute load, the full proxy run) for every "
                         "section, or for a comma list of them: --full=load")
    ap.add_argument("--only", help=f"comma list of {', '.join(s.key for s in SECTIONS)}")
    ap.add_argument("--out", type=Path, default=HERE / "results.md")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # run one section in this process
    ap.add_argument("--answer", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.chdir(HERE.parent)  # the sections' default paths are relative to the checkout
    if args.child:
        return child(next(s for s in SECTIONS if s.key == args.child), args.full == "all",
                     args.answer)
    keys = {s.key for s in SECTIONS}
    wanted = set(args.only.split(",")) if args.only else keys
    full = keys if args.full == "all" else set(filter(None, args.full.split(",")))
    if unknown := (wanted | full) - keys:
        ap.error(f"unknown sections {sorted(unknown)}")
    start_load = f"{os.getloadavg()[0]:.2f}"
    outcomes = [run_section(s, s.key in full) for s in SECTIONS if s.key in wanted]
    command = "python bench/run.py" + (" " + " ".join(argv if argv is not None
                                                       else sys.argv[1:])).rstrip()
    text = render(outcomes, command.strip(), (start_load, f"{os.getloadavg()[0]:.2f}"))
    args.out.write_text(text)  # the docs site's Benchmarks page includes this file
    print("\n" + text + f"\nwritten to {args.out}")
    return 1 if any(o.note.startswith("failed") for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
