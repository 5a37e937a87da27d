#!/usr/bin/env python3
"""Load: many concurrent streaming rollouts in all four dialects against one proxy.

The proxy runs in its own process (`bench/proxy/load_server.py`: the real app, a paced scripted
engine, an event-loop lag probe); this process is the load generator (raw aiohttp streaming
clients on uvloop, so the client side stays cheap). Each of `--streams` workers holds one
conversation at a time in its dialect (chat, responses, anthropic, gemini in turn): it
mints a rollout, sends `--turns` streamed requests that resend the growing history (a
system prompt, every earlier reply, a new user message), closes the rollout, starts over.
At the deadline no new request starts; the ones in flight finish.

Reported, each against a baseline from the same run:
  errors            HTTP errors, error events, broken or incomplete streams (must be 0)
  lost/duplicated   every request the client saw complete has exactly one `ok` turn with
                    its reply id in the store (read after the proxy stopped), and no
                    reply id is stored twice; the store passes PRAGMA integrity_check
  memory            proxy RSS sampled over time; flat = every sample after the warm-up
                    within 10% of the first one after it
  event-loop lag    p50/p99/max measured inside the proxy after the warm-up, against the
                    idle proxy's before the load starts
  throughput        turns/s and tokens/s; turn time against the engine's own pace

    .venv/bin/python bench/proxy/load.py                  # 256 streams, 10 minutes
    .venv/bin/python bench/proxy/load.py --duration 30    # a quick check
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import uvloop

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "common")]  # bench/ is not a package

from load_report import figures, render  # noqa: E402
from procstat import (  # noqa: E402
    busy_percent,
    cpu_s,
    machine_ticks,
    others,
    process_cpu,
    rss_mib,
    run_delay_s,
)
from table import Row, figure_table  # noqa: E402

DIALECTS = ("chat", "responses", "anthropic", "gemini")
SYSTEM = ("You are a coding agent working in a small Python repository. Read files before "
          "editing them, keep changes small, run the tests after each edit, and explain "
          "what you changed in one short paragraph. ") * 8
_decode = msgspec.json.decode


# ------------------------------------------------------------------ one streamed call
def request_for(dialect: str, root: str, history: list[tuple[str, str]]
                ) -> tuple[str, dict[str, Any]]:
    """URL and body of a streamed call in `dialect` carrying the whole history."""
    if dialect == "chat":
        messages = [{"role": "system", "content": SYSTEM}]
        messages += [{"role": r, "content": t} for r, t in history]
        return f"{root}/v1/chat/completions", {"model": "scripted", "messages": messages,
                                               "stream": True, "max_tokens": 1024}
    if dialect == "responses":
        return f"{root}/v1/responses", {
            "model": "scripted", "instructions": SYSTEM, "stream": True,
            "input": [{"role": r, "content": t} for r, t in history]}
    if dialect == "anthropic":
        return f"{root}/v1/messages", {
            "model": "scripted", "system": SYSTEM, "max_tokens": 1024, "stream": True,
            "messages": [{"role": r, "content": t} for r, t in history]}
    contents = [{"role": "model" if r == "assistant" else "user", "parts": [{"text": t}]}
                for r, t in history]
    return f"{root}/v1beta/models/scripted:streamGenerateContent?alt=sse", {
        "systemInstruction": {"parts": [{"text": SYSTEM}]}, "contents": contents}


class StreamError(Exception):
    pass


@dataclass
class Reply:
    """What the client read from one stream."""

    reply_id: str = ""
    text: list[str] = field(default_factory=list)
    done: bool = False
    ttft: float = float("nan")


def feed(dialect: str, data: bytes, reply: Reply) -> None:
    """One SSE event's data in `dialect`; raises StreamError on the dialect's error event."""
    if data == b"[DONE]":
        reply.done = True
        return
    event = _decode(data)
    if ("error" in event and dialect in ("chat", "gemini")) or event.get("type") in (
            "error", "response.failed"):
        raise StreamError(f"error event: {data[:300]!r}")
    if dialect == "chat":
        reply.reply_id = event["id"]
        for choice in event.get("choices", ()):
            if content := choice.get("delta", {}).get("content"):
                reply.text.append(content)
    elif dialect == "responses":
        kind = event["type"]
        if kind == "response.output_text.delta":
            reply.text.append(event["delta"])
        elif kind == "response.created":
            reply.reply_id = event["response"]["id"]
        elif kind == "response.completed":
            reply.done = True
    elif dialect == "anthropic":
        kind = event["type"]
        if kind == "content_block_delta" and event["delta"].get("type") == "text_delta":
            reply.text.append(event["delta"]["text"])
        elif kind == "message_start":
            reply.reply_id = event["message"]["id"]
        elif kind == "message_stop":
            reply.done = True
    else:
        reply.reply_id = event.get("responseId", reply.reply_id)
        for candidate in event.get("candidates", ()):
            for part in candidate.get("content", {}).get("parts", ()):
                if text := part.get("text"):
                    reply.text.append(text)
            if candidate.get("finishReason"):
                reply.done = True


async def call(http: aiohttp.ClientSession, dialect: str, root: str,
               history: list[tuple[str, str]]) -> Reply:
    url, body = request_for(dialect, root, history)
    reply, started = Reply(), time.perf_counter()
    async with http.post(url, json=body) as resp:
        if resp.status != 200:
            raise StreamError(f"HTTP {resp.status}: {(await resp.read())[:300]!r}")
        buffer = b""
        async for chunk in resp.content.iter_any():
            buffer += chunk
            *events, buffer = buffer.split(b"\n\n")
            for block in events:
                for line in block.split(b"\n"):
                    if line.startswith(b"data: "):
                        feed(dialect, line[6:], reply)
                if reply.text and math.isnan(reply.ttft):
                    reply.ttft = time.perf_counter() - started
    if not reply.done or not reply.reply_id or buffer.strip():
        raise StreamError(f"the stream ended early (done={reply.done}, id={reply.reply_id!r})")
    return reply


# ------------------------------------------------------------------ workers
@dataclass
class Tally:
    """What the client saw, shared by every worker."""

    completed: list[tuple[str, str]] = field(default_factory=list)  # (rollout, reply id)
    sent: Counter[str] = field(default_factory=Counter)  # requests per rollout
    errors: Counter[str] = field(default_factory=Counter)
    error_samples: list[str] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    turn_s: list[float] = field(default_factory=list)
    chars: int = 0
    conversations: int = 0

    def error(self, dialect: str, exc: BaseException) -> None:
        self.errors[dialect] += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(f"{dialect}: {type(exc).__name__}: {exc}"[:400])


@dataclass
class Plan:
    base: str
    turns: tuple[int, int]
    deadline: float
    think: float
    rng: random.Random
    calls: int | None = None  # stop once this many calls are complete (the soak)

    def over(self, tally: Tally) -> bool:
        return time.monotonic() >= self.deadline or (
            self.calls is not None and len(tally.completed) >= self.calls)


async def conversation(http: aiohttp.ClientSession, dialect: str, plan: Plan,
                       tally: Tally) -> None:
    async with http.post(f"{plan.base}/rollouts", json={}) as resp:
        resp.raise_for_status()
        key = (await resp.json())["key"]
    root, history = f"{plan.base}/r/{key}", []
    try:
        for turn in range(plan.rng.randint(*plan.turns)):
            if plan.over(tally):
                break
            history.append(("user", f"Step {turn}: run the tests and fix what fails."))
            tally.sent[key] += 1
            started = time.perf_counter()
            reply = await call(http, dialect, root, history)
            tally.turn_s.append(time.perf_counter() - started)
            tally.ttft.append(reply.ttft)
            tally.completed.append((key, reply.reply_id))
            text = "".join(reply.text)
            tally.chars += len(text)
            history.append(("assistant", text))
            if plan.think:
                await asyncio.sleep(plan.think)
    finally:
        tally.conversations += 1
        with contextlib.suppress(aiohttp.ClientError):
            async with http.delete(f"{plan.base}/rollouts/{key}",
                                   headers={"authorization": f"Bearer {key}"}):
                pass


async def worker(http: aiohttp.ClientSession, index: int, plan: Plan, tally: Tally,
                 stagger: float) -> None:
    dialect = DIALECTS[index % len(DIALECTS)]
    await asyncio.sleep(plan.rng.uniform(0, stagger))  # no thundering start
    while not plan.over(tally):
        try:
            await conversation(http, dialect, plan, tally)
        except (TimeoutError, StreamError, aiohttp.ClientError, KeyError,
                msgspec.DecodeError) as exc:
            tally.error(dialect, exc)
            await asyncio.sleep(0.5)


# ------------------------------------------------------------------ the proxy process
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def proxy_process(args: argparse.Namespace, work: Path) -> Iterator[tuple[int, str]]:
    # `--release DIR`: the proxy (its load_server.py and its sources) from another
    # checkout, e.g. an older release, driven by this client.
    root = args.release or HERE.parents[1]
    server_py = root / "bench" / "proxy" / "load_server.py"
    if not server_py.exists():  # a release from before bench/ had group folders
        server_py = root / "bench" / "load_server.py"
    port, server = free_port(), [sys.executable, str(server_py)]
    path = [str(root / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    pool = ["--pool", str(work / "pool.json"), "--seed", str(args.seed)]
    subprocess.run([*server, *pool, "--write-pool", "--min-tokens", str(args.min_tokens),
                    "--max-tokens", str(args.max_tokens)], check=True, env=env)
    argv = [*server, *pool, "--port", str(port), "--run-dir", str(work / "run"),
            "--rate", f"{args.rate:g}"]
    with (work / "proxy.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}", work / "proxy.log")
        yield proc.pid, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_healthy(proc: subprocess.Popen[bytes], base: str, log: Path) -> None:
    import urllib.request

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the proxy exited:\n{log.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(OSError), urllib.request.urlopen(
                f"{base}/health", timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError("the proxy did not answer /health in 120 s")


# ------------------------------------------------------------------ the run
@dataclass
class Sample:
    t: float
    turns: int
    rss: float
    proxy_cpu: float  # % of one core over the interval
    client_cpu: float
    cpu_wait: float  # % of the interval the proxy's loop thread was runnable but not running


@dataclass
class Result:
    args: argparse.Namespace
    tally: Tally
    samples: list[Sample]
    idle_lag: dict[str, float]
    lag: dict[str, float]
    wall: float
    others: str = ""
    store: dict[str, Any] = field(default_factory=dict)
    loadavg: str = ""
    busy: float = math.nan  # % of one core the whole machine was busy, all processes


async def get_json(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(url) as resp:
        resp.raise_for_status()
        return await resp.json()


async def sampler(pid: int, base: str, http: aiohttp.ClientSession, args: argparse.Namespace,
                  tally: Tally, start: float, out: list[Sample]) -> None:
    last_t, last_p, last_c, last_w = start, cpu_s(pid), time.process_time(), run_delay_s(pid)
    reset = False
    while True:
        await asyncio.sleep(args.sample_every)
        now, proxy, client, wait = (time.monotonic(), cpu_s(pid), time.process_time(),
                                    run_delay_s(pid))
        span = max(now - last_t, 1e-9)
        out.append(Sample(now - start, len(tally.completed), rss_mib(pid),
                          (proxy - last_p) / span * 100, (client - last_c) / span * 100,
                          (wait - last_w) / span * 100))
        last_t, last_p, last_c, last_w = now, proxy, client, wait
        if not reset and now - start >= args.warmup:  # steady state: lag counts from here
            await get_json(http, f"{base}/_bench/lag/reset")
            reset = True


async def drive(args: argparse.Namespace, pid: int, base: str) -> Result:
    tally, samples = Tally(), []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await get_json(http, f"{base}/_bench/lag/reset")
        await asyncio.sleep(args.idle)
        idle_lag = await get_json(http, f"{base}/_bench/lag")
        print(f"idle proxy: lag p99 {idle_lag['p99_ms']:.1f} ms, RSS {rss_mib(pid):.1f} MiB; "
              f"{args.streams} streams for {args.duration:g} s", flush=True)
        # What the rest of the machine does is read over the load phase only.
        machine0, procs0, load0 = machine_ticks(), process_cpu(), os.getloadavg()[0]
        start = time.monotonic()
        plan = Plan(base, (args.min_turns, args.max_turns), start + args.duration, args.think,
                    random.Random(args.seed), args.calls)
        watch = asyncio.create_task(sampler(pid, base, http, args, tally, start, samples))
        progress = asyncio.create_task(report_progress(tally, samples, start))
        await asyncio.gather(*(worker(http, i, plan, tally, args.stagger)
                               for i in range(args.streams)))
        wall = time.monotonic() - start
        machine1, procs1, load1 = machine_ticks(), process_cpu(), os.getloadavg()[0]
        watch.cancel()
        if args.calls:  # the soak's last figure: RSS once every call is done
            samples.append(Sample(wall, len(tally.completed), rss_mib(pid), math.nan,
                                  math.nan, math.nan))
        progress.cancel()
        lag = await get_json(http, f"{base}/_bench/lag")
    return Result(args, tally, samples, idle_lag, lag, wall,
                  others=others(procs0, procs1, {os.getpid(), pid}, wall),
                  busy=busy_percent(machine0, machine1),
                  loadavg=f"{load0:.2f} at the start, {load1:.2f} at the end (1-minute "
                          "load average)")


async def report_progress(tally: Tally, samples: list[Sample], start: float) -> None:
    while True:
        await asyncio.sleep(30)
        rss = samples[-1].rss if samples else float("nan")
        print(f"  {time.monotonic() - start:5.0f} s: {len(tally.completed):,} turns, "
              f"{sum(tally.errors.values())} errors, proxy RSS {rss:.1f} MiB", flush=True)


def check_store(path: Path, tally: Tally) -> dict[str, Any]:
    """Every completed request has exactly one ok turn with its reply id; nothing twice."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT rollout, reply_id, status, length(completion_ids) / 4 "
                          "FROM turns").fetchall()
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        db.close()
    ok = Counter((r, rid) for r, rid, status, _ in rows if status == "ok")
    every = Counter((r, rid) for r, rid, _, _ in rows)
    per_rollout = Counter(r for r, *_ in rows)
    return {
        "rows": len(rows), "integrity": integrity,
        "lost": sum(1 for done in tally.completed if ok[done] == 0),
        "duplicated": sum(n - 1 for n in every.values() if n > 1),
        "beyond_sent": sum(max(0, n - tally.sent[k]) for k, n in per_rollout.items()),
        "statuses": dict(Counter(status for _, _, status, _ in rows)),
        "tokens": sum(n or 0 for r, rid, status, n in rows if status == "ok"),
    }


def run(argv: list[str] | None = None) -> Result:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="harnessrl-load-"))
    with proxy_process(args, work) as (pid, base):
        result = uvloop.run(drive(args, pid, base))
    result.store = check_store(work / "run" / "trace.db", result.tally)
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"work directory kept: {work}")
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=256, help="concurrent streaming rollouts")
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    ap.add_argument("--warmup", type=float, help="seconds before memory and lag count "
                    "(default: 1.5 times the longest conversation at the engine's pace, at "
                    "most a quarter of the duration)")
    ap.add_argument("--rate", type=float, default=40.0, help="engine tokens/s per stream")
    ap.add_argument("--min-tokens", type=int, default=100, help="shortest reply")
    ap.add_argument("--max-tokens", type=int, default=300, help="longest reply")
    ap.add_argument("--min-turns", type=int, default=4, help="shortest conversation")
    ap.add_argument("--max-turns", type=int, default=12, help="longest conversation")
    ap.add_argument("--think", type=float, default=0.0, help="client pause between turns, s")
    ap.add_argument("--stagger", type=float, default=5.0, help="spread of the workers' start")
    ap.add_argument("--idle", type=float, default=5.0, help="idle lag baseline, s")
    ap.add_argument("--sample-every", type=float, default=5.0, help="RSS sampling period, s")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=HERE / "load.md",
                    help="Markdown report ('-': none)")
    ap.add_argument("--keep", action="store_true", help="keep the run directory")
    ap.add_argument("--calls", type=int, help="end once this many calls are complete (a "
                    "soak: the report gives the proxy's RSS at 1,000-call marks)")
    ap.add_argument("--release", type=Path, help="run the proxy from this checkout (its "
                    "bench/proxy/load_server.py and src/), e.g. a worktree of an older release")
    args = ap.parse_args(argv)
    if args.warmup is None:  # the longest conversations have run once (RSS has its peak)
        longest = args.max_turns * (args.min_tokens + args.max_tokens) / 2 / args.rate
        args.warmup = max(2 * args.stagger, min(args.duration / 4, 1.5 * longest))
    return args


def rows(argv: list[str] | None = None) -> list[Row]:
    """The runner's rows (bench/run.py); the full report goes to --out as well."""
    result = run(argv)
    if str(result.args.out) != "-":
        result.args.out.write_text(render(
            result, f"python bench/proxy/load.py {' '.join(argv or [])}", len(SYSTEM.split())))
    return figures(result)


def main(argv: list[str] | None = None) -> int:
    result = run(argv)
    args = result.args
    given = argv if argv is not None else sys.argv[1:]
    command = "python bench/proxy/load.py" + ("" if not given else " " + " ".join(given))
    print("\n".join(figure_table(figures(result))))
    for sample in result.tally.error_samples:
        print(f"  error: {sample}")
    if str(args.out) != "-":
        args.out.write_text(render(result, command, len(SYSTEM.split())))
        print(f"\nreport written to {args.out}")
    rows = figures(result)
    return 0 if all(not r.verdict.startswith("FAIL") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
