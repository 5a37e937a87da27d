#!/usr/bin/env python3
"""Proxy CPU per streamed token and per call, per dialect, against a baseline proxy in the
same run.

    .venv/bin/python bench/proxy/stream_cpu.py                   # baseline: 9b86db5 (before 19)
    .venv/bin/python bench/proxy/stream_cpu.py --baseline HEAD~3 # any revision's proxy
    .venv/bin/python bench/proxy/stream_cpu.py --quick

Two proxies run side by side on one fake vLLM (`../shared/tools/bench_engine.py`): this
checkout's `src/` and a baseline (`git archive <rev> src`, unpacked into a temporary
directory and put first on PYTHONPATH; the working tree and the repository are not
touched). The client is a raw aiohttp loop, cheap next to an SDK, so the box's two cores
go to the proxies. Requests alternate between the proxies in blocks; each block's CPU is
read from the proxy's `/proc/<pid>/task/*/schedstat` (ns, all threads), so the machine's
other load hits both sides alike. The ratio column (this / baseline) is the figure to
trust on a loaded box; the absolute µs move with the load.

Beside them, on the same calls: unless `--floors ''`, bench/proxy/floor_relay.py, relays that
only copy the engine's bytes (raw asyncio, and a bare ASGI app under uvicorn), the floor any
proxy on this machine stands on (kernel, event loop, HTTP parsing) and uvicorn's share;
`socat` (Debian's, in C: poll, read, write), given the proxy's own engine request and
copying both ways, the floor under a relay in any language, which is the kernel's and the
VM's cost of a read and a write (skipped when socat is not installed); and
unless `--reference none`, the reference proxy (openenv 0.10.0's capture server, in a venv
of its own built once in the cache), which asks its engine for the whole reply and replays
it as one event (so its CPU per streamed reply is a call's, not a stream's).

Workload: a ~4,000-token prompt, 200-token replies streamed at 2 ms per token (one read
per token), streamed at 0 ms (the engine ahead of the proxy: several tokens per read), or
non-streamed at 0 ms (the per-call fixed cost); `MODES`. CPU per token is the proxy's CPU
per streamed reply divided by the reply's tokens (gross: the call's fixed cost included).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "common")]  # bench/ is not a package

import proxy_overhead as po  # noqa: E402  (its Service, engine and proxy starters)
from table import Row  # noqa: E402
from table import verdict as verdict_of  # noqa: E402

ROOT = HERE.parents[1]
TOKENS = 200
# What the proxy adds to a chat body for the engine (openai_wire.chat_body): a floor that
# passes the client's request on unchanged (socat) is sent this, the proxy's own request.
CAPTURE = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True}
PROMPT = ("def handler(event, context):\n    return {'status': 200, 'body': event}\n" * 220)
SYSTEM = "You are a coding agent. Follow the repository's rules. " * 150


# ------------------------------------------------------------------ the dialects' requests
def request(dialect: str, stream: bool, nonce: int) -> tuple[str, dict[str, Any]]:
    """(path under /r/<key>, body) of one call in `dialect`."""
    user = f"{PROMPT}\n# request {nonce}"
    if dialect == "chat":
        body: dict[str, Any] = {
            "model": "bench-model", "max_tokens": 256, "stream": stream,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": user}]}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return "/v1/chat/completions", body
    if dialect == "responses":
        return "/v1/responses", {
            "model": "bench-model", "max_output_tokens": 256, "stream": stream,
            "instructions": SYSTEM, "input": [{"role": "user", "content": user}]}
    if dialect == "anthropic":
        return "/v1/messages", {
            "model": "bench-model", "max_tokens": 256, "stream": stream, "system": SYSTEM,
            "messages": [{"role": "user", "content": user}]}
    if dialect == "gemini":
        verb = "streamGenerateContent?alt=sse" if stream else "generateContent"
        return f"/v1beta/models/bench-model:{verb}", {
            "systemInstruction": {"parts": [{"text": SYSTEM}]},
            "contents": [{"role": "user", "parts": [{"text": user}]}],
            "generationConfig": {"maxOutputTokens": 256}}
    raise ValueError(dialect)


# ------------------------------------------------------------------ proxies
@dataclass
class Side:
    name: str
    src: Path
    floor: str = ""  # bench/proxy/floor_relay.py --server <floor> instead of a harnessrl proxy
    reference: Path | None = None  # the reference proxy's venv instead of a harnessrl proxy
    pace_ms: float = 0.0  # this proxy with `serve --stream-interval-ms`
    proxy: po.Service | None = None
    url: str = ""
    key: str = ""
    cpu_ns: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # per call
    wall_s: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # each call

    def start(self, engine_url: str, work: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(self.src)}
        port, run_dir = po.free_port(), work / f"run-{self.name}"
        argv = [sys.executable, "-m", "harnessrl.cli", "serve", "--engine-url", engine_url,
                "--run-dir", str(run_dir), "--port", str(port)]
        if self.floor == "socat":  # a child per connection; `block` counts the children
            engine = engine_url.removeprefix("http://")
            argv = ["socat", f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork",
                    f"TCP:{engine}"]
        elif self.floor:
            argv = [sys.executable, str(HERE / "floor_relay.py"), "--port", str(port),
                    "--engine-url", engine_url, "--server", self.floor]
        elif self.reference is not None:  # its own venv: nothing of ours on its path
            env.pop("PYTHONPATH")
            argv = [str(self.reference / "bin" / "python"), "-m",
                    "openenv.core.harness.capture.server", "--llm-url", engine_url,
                    "--model", "bench-model", "--port", str(port), "--capture-level", "tokens"]
        elif "--workers" in _cli_source(self.src):
            argv += ["--workers", "1"]  # one process: its CPU is the figure
        if self.pace_ms:
            argv += ["--stream-interval-ms", str(self.pace_ms)]
        log = work / f"proxy-{self.name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env)
        service = po.Service.__new__(po.Service)
        service.name, service.log, service.proc = f"proxy ({self.name})", log, proc
        self.proxy, self.url = service, f"http://127.0.0.1:{port}"
        po.wait_for(lambda: True if po.httpx.get(f"{self.url}/health", timeout=2)
                    .status_code == 200 else None, service, "waiting for /health")

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()


REFERENCE = "openenv==0.10.0"


def reference_venv() -> Path:
    """A venv holding only the reference proxy, as its own dependency list installs it
    (plain uvicorn, no uvloop or httptools), built once under the cache."""
    cache = Path(os.environ.get("HARNESSRL_CACHE", Path.home() / ".cache" / "harnessrl"))
    venv = cache / f"bench-reference-{REFERENCE.replace('==', '-')}"
    if not (venv / ".complete").exists():
        print(f"installing {REFERENCE} into {venv} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                        REFERENCE], check=True)
        (venv / ".complete").touch()
    return venv


def baseline_src(rev: str, work: Path) -> Path:
    """The baseline's `src/` from `git archive` (the repository is only read)."""
    archive = work / "baseline.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(work / "baseline", filter="data")
    return work / "baseline" / "src"


# ------------------------------------------------------------------ client
async def new_key(http: aiohttp.ClientSession, side: Side) -> str:
    if side.floor == "socat":  # the engine's own route: no rollouts
        return ""
    if side.reference is not None:  # its sessions: the key is the caller's API key
        async with http.post(f"{side.url}/sessions", json={}) as resp:
            return (await resp.json())["session_id"]
    async with http.post(f"{side.url}/rollouts", data=b"{}") as resp:
        return (await resp.json())["key"]


async def one_call(http: aiohttp.ClientSession, side: Side, dialect: str, stream: bool,
                   nonce: int) -> int:
    path, body = request(dialect, stream, nonce)
    url = f"{side.url}/r/{side.key}{path}"
    headers = {"content-type": "application/json"}
    if side.floor == "socat":  # what the proxy would send the engine, for every dialect
        path, body = request("chat", stream, nonce)
        url, body = f"{side.url}{path}", {**body, **CAPTURE}
    if side.reference is not None:
        url = f"{side.url}{path}"
        headers |= {"authorization": f"Bearer {side.key}", "x-api-key": side.key,
                    "x-goog-api-key": side.key}
    got = 0
    async with http.post(url, data=json.dumps(body).encode(), headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{side.name} {dialect}: HTTP {resp.status} "
                               f"{(await resp.read())[:300]!r}")
        async for piece in resp.content.iter_any():
            got += len(piece)
    return got


# (streamed, the engine's ms per token) of each mode. "sse": one token a read, an engine no
# faster than the proxy; "ahead": the engine at 0 ms, so the tokens waiting at each read go
# on together (one parse feed and one write a read); "json": non-streamed.
MODES = {"sse": (True, 2.0), "ahead": (True, 0.0), "json": (False, 0.0)}


async def block(http: aiohttp.ClientSession, side: Side, dialect: str, mode: str,
                calls: int, conc: int, nonce: list[int]) -> float:
    """CPU ns of the proxy per call over `calls` calls at concurrency `conc`."""
    assert side.proxy is not None
    pid = side.proxy.pid
    left = list(range(calls))

    async def worker() -> None:
        while left:
            left.pop()
            nonce[0] += 1
            start = time.perf_counter()
            await one_call(http, side, dialect, MODES[mode][0], nonce[0])
            side.wall_s.setdefault((dialect, mode), []).append(time.perf_counter() - start)

    cpu_ns = tree_cpu_ns if side.floor == "socat" else po.cpu_ns
    before = cpu_ns(pid)
    await asyncio.gather(*(worker() for _ in range(conc)))
    return (cpu_ns(pid) - before) / calls


def tree_cpu_ns(pid: int) -> int:
    """CPU ns of `pid` and its children (socat's, one per connection: the keep-alive
    connections live through a block, so none exits inside one)."""
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as fh:
            children += [int(child) for child in fh.read().split()]
    total = po.cpu_ns(pid)
    for child in children:
        with contextlib.suppress(FileNotFoundError):  # a connection closed meanwhile
            total += po.cpu_ns(child)
    return total


async def engine_config(http: aiohttp.ClientSession, engine_url: str, delay_ms: float) -> None:
    async with http.post(f"{engine_url}/config",
                         data=json.dumps({"tokens": TOKENS, "delay_ms": delay_ms})) as resp:
        await resp.read()


async def measure_async(sides: Sequence[Side], engine_url: str, dialects: Sequence[str],
                        blocks: int, calls: int, conc: int) -> None:
    nonce = [0]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        for side in sides:
            side.key = await new_key(http, side)
        for mode, (stream, delay) in MODES.items():
            await engine_config(http, engine_url, delay)
            for dialect in dialects:
                for side in sides:  # warm-up: imports, first-call caches
                    await block(http, side, dialect, mode, 2, 1, nonce)
                for b in range(blocks):
                    order = sides if b % 2 == 0 else list(reversed(sides))
                    for side in order:
                        n = calls if stream else calls * 4
                        per = await block(http, side, dialect, mode, n, conc, nonce)
                        side.cpu_ns.setdefault((dialect, mode), []).append(per)


# ------------------------------------------------------------------ report
DIALECTS = ("chat", "responses", "anthropic", "gemini")


def figures(sides: Sequence[Side]) -> list[dict[str, Any]]:
    this, base = sides[:2]
    floors = [side for side in sides if side.floor]
    paced = [side for side in sides if side.pace_ms]
    reference = next((side for side in sides if side.reference is not None), None)
    out = []
    for (dialect, mode), values in this.cpu_ns.items():
        ref = base.cpu_ns[(dialect, mode)]
        mine, theirs = statistics.median(values), statistics.median(ref)
        found = {"dialect": dialect, "mode": mode, "this_us": mine / 1e3,
                 "base_us": theirs / 1e3, "ratio": mine / theirs,
                 "blocks": [v / 1e3 for v in values], "base_blocks": [v / 1e3 for v in ref]}
        found["floors_us"] = {side.floor: statistics.median(side.cpu_ns[(dialect, mode)]) / 1e3
                              for side in floors}
        if reference is not None:
            found["reference_us"] = statistics.median(reference.cpu_ns[(dialect, mode)]) / 1e3
        wall = statistics.median(this.wall_s[(dialect, mode)])
        found["paced"] = [{"ms": side.pace_ms,
                           "us": statistics.median(side.cpu_ns[(dialect, mode)]) / 1e3,
                           "added_ms": (statistics.median(side.wall_s[(dialect, mode)])
                                        - wall) * 1e3} for side in paced]
        out.append(found)
    return out


def others_note(f: dict[str, Any], streamed: bool) -> str:
    """The floors' and the reference proxy's figures beside ours, when they ran."""
    def value(us: float) -> str:
        return f"{us / TOKENS:.1f} µs" if streamed else f"{us / 1e3:.2f} ms"

    note = ""
    if f["floors_us"]:
        note += "; relays that only copy bytes (the floor): " + ", ".join(
            f"{name} {value(us)}" for name, us in f["floors_us"].items())
    if "reference_us" in f:
        note += (f"; reference proxy {value(f['reference_us'])} (this / reference "
                 f"{f['this_us'] / f['reference_us']:.2f})")
    return note


# What a streamed mode's row adds to its name.
STREAMED_ROW = {"sse": "", "ahead": ", the engine ahead of the proxy (0 ms/token: the tokens "
                                    "waiting at a read go on together)"}


def rows_from(found: list[dict[str, Any]], baseline: str) -> list[Row]:
    rows = []
    for f in found:
        if f["mode"] in STREAMED_ROW:
            per_token, base_token = f["this_us"] / TOKENS, f["base_us"] / TOKENS
            rows.append(Row(f"proxy CPU per streamed token, {f['dialect']}"
                            f"{STREAMED_ROW[f['mode']]}",
                            f"{per_token:.1f} µs ({f['this_us'] / 1e3:.2f} ms/reply)",
                            f"{base_token:.1f} µs at {baseline}; ratio {f['ratio']:.2f}"
                            + others_note(f, True), "≤ 15 µs", verdict_of(per_token <= 15)))
            if f["mode"] != "sse":
                continue
            rows += [Row(f"proxy CPU per streamed token, {f['dialect']}, reads paced at "
                         f"{p['ms']:g} ms (serve --stream-interval-ms {p['ms']:g})",
                         f"{p['us'] / TOKENS:.1f} µs ({p['us'] / 1e3:.2f} ms/reply)",
                         f"unpaced {per_token:.1f} µs, ratio {p['us'] / f['this_us']:.2f}; "
                         f"reply time p50 {p['added_ms']:+.1f} ms vs unpaced",
                         "≤ 15 µs", verdict_of(p["us"] / TOKENS <= 15))
                     for p in f["paced"]]
        else:
            verdict = verdict_of(f["this_us"] <= 1500)
            rows.append(Row(f"proxy CPU per non-streamed 4k-token call, {f['dialect']}",
                            f"{f['this_us'] / 1e3:.2f} ms",
                            f"{f['base_us'] / 1e3:.2f} ms at {baseline}; ratio "
                            f"{f['ratio']:.2f}" + others_note(f, False), "≤ 1.5 ms", verdict))
    return rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="9b86db5",
                    help="git revision whose src/ is the baseline proxy")
    ap.add_argument("--dialects", default=",".join(DIALECTS))
    ap.add_argument("--blocks", type=int, default=4, help="alternating blocks per side")
    ap.add_argument("--calls", type=int, default=6, help="streamed calls per block "
                    "(non-streamed: 4x)")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="2 blocks of 3 calls")
    ap.add_argument("--reference", default="auto",
                    help="venv of the reference proxy (openenv==0.10.0's capture server); "
                         "'auto' builds one once in the cache, 'none' leaves it out")
    ap.add_argument("--floors", default="raw,uvicorn,socat",
                    help="byte-copying relays to run beside the proxies (bench/proxy/floor_relay.py"
                         " --server raw|uvicorn, and socat), '' for none")
    ap.add_argument("--paced", default="20",
                    help="stream intervals (ms, comma-separated) at which this proxy also "
                         "runs (serve --stream-interval-ms), '' for none")
    ap.add_argument("--json", type=Path, help="write the raw figures here")
    ap.add_argument("--tools-dir", type=Path,
                    default=Path(os.environ.get("HARNESSRL_BENCH_TOOLS", po.DEFAULT_TOOLS)))
    args = ap.parse_args(argv)
    if args.quick:
        args.blocks, args.calls = 2, 3
    return args


def measure(argv: Sequence[str] | None = None) -> tuple[list[dict[str, Any]], str]:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stream-cpu-") as tmp:
        work = Path(tmp)
        sides = [Side("this", ROOT / "src"), Side(args.baseline, baseline_src(args.baseline,
                                                                              work))]
        sides += [Side(f"this@{ms}ms", ROOT / "src", pace_ms=float(ms))
                  for ms in filter(None, args.paced.split(","))]
        floors = [kind for kind in filter(None, args.floors.split(","))
                  if kind != "socat" or shutil.which("socat")]
        if "socat" in args.floors.split(",") and "socat" not in floors:
            print("stream_cpu: socat is not installed (apt-get install socat): its floor "
                  "is left out", file=sys.stderr)
        sides += [Side(f"floor-{kind}", ROOT / "src", floor=kind) for kind in floors]
        if args.reference != "none":
            venv = reference_venv() if args.reference == "auto" else Path(args.reference)
            sides.append(Side("reference", ROOT / "src", reference=venv))
        engine, engine_url = po.start_engine(args.tools_dir, work)
        try:
            for side in sides:
                side.start(engine_url, work)
            t0 = time.monotonic()
            asyncio.run(measure_async(sides, engine_url, args.dialects.split(","),
                                      args.blocks, args.calls, args.concurrency))
            print(f"measured in {time.monotonic() - t0:.0f} s", file=sys.stderr)
        finally:
            for side in sides:
                side.stop()
            engine.stop()
    found = figures(sides)
    if args.json:
        args.json.write_text(json.dumps(found, indent=1))
    return found, args.baseline


def rows(argv: Sequence[str] | None = None) -> list[Row]:
    found, baseline = measure(argv)
    return rows_from(found, baseline)


def main(argv: Sequence[str] | None = None) -> int:
    found, baseline = measure(argv)
    print(f"| dialect | mode | this µs/call | {baseline} µs/call | ratio | others µs/call "
          "| per token (sse) |")
    print("|---|---|---|---|---|---|---|")
    for f in found:
        tok = f"{f['this_us'] / TOKENS:.1f} vs {f['base_us'] / TOKENS:.1f}" \
            if MODES[f["mode"]][0] else ""
        others = [f"paced {p['ms']:g} ms {p['us']:.0f}" for p in f["paced"]]
        others += [f"{k} {v:.0f}" for k, v in f["floors_us"].items()]
        if "reference_us" in f:
            others.append(f"reference {f['reference_us']:.0f}")
        floors = ", ".join(others)
        print(f"| {f['dialect']} | {f['mode']} | {f['this_us']:.0f} | {f['base_us']:.0f} | "
              f"{f['ratio']:.2f} | {floors} | {tok} |")
    print("blocks (µs/call):", json.dumps({f"{f['dialect']}/{f['mode']}":
                                           [f["blocks"], f["base_blocks"]] for f in found}))
    return 0


def _cli_source(src: Path) -> str:
    """The command line's source at a revision: one module before issue 33, a package after."""
    single = src / "harnessrl" / "cli.py"
    if single.is_file():
        return single.read_text()
    return "".join(p.read_text() for p in sorted((src / "harnessrl" / "cli").glob("*.py")))


if __name__ == "__main__":
    sys.exit(main())
