#!/usr/bin/env python3
"""Requests per second at saturation through `serve --workers N`, 1 worker against N, with
an instant engine: what more cores buy.

The engine is instant and cheap (bench/proxy/load_server.py's pre-tokenized reply pool, each
reply in one chunk), so the proxy's own work is what is measured. The client is as cheap
as a client can be, so that on a small machine the proxy, not the client, saturates: raw
HTTP/1.1 on uvloop, one kept-alive connection per rollout, requests prebuilt, answers
parsed only for their status and length. Each rollout is made through the shared port;
`owner` talks to the base URL it got back (its owner's own port, as a harness does),
`shared` keeps talking to the shared port, where the kernel's choice of worker relays
about (N-1)/N of the calls to their owner.

    .venv/bin/python bench/proxy/workers.py --workers 1,2 --seconds 10 --connections 32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import httpx
import uvloop

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "common")]  # bench/ is not a package

from table import Row, figure_table  # noqa: E402

_BODY = json.dumps({"model": "m", "max_tokens": 8,
                    "messages": [{"role": "user", "content": "say ok"}]}).encode()


@dataclass
class Result:
    workers: int
    mode: str
    requests: int
    errors: int
    seconds: float
    client_cpu: float  # seconds of this process's CPU while measuring
    load: float  # 1-minute load average at the end

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


# -------------------------------------------------------------------- the server
# The engine is load_server.py's: a pool of replies tokenized once (in its own process, so
# no worker imports transformers), the prompt "tokenized" by hashing words, each reply in
# one chunk: an instant engine whose own cost is negligible beside the proxy's.
def serve_main(workers: int, pool: Path, run_dir: Path, port: int) -> int:
    """The server under measurement, in its own process: one worker exactly as `harnessrl
    serve --workers 1` runs it, or N as `--workers N` does (proxy/workers.py)."""
    from harnessrl.proxy.serve import build, run, serve
    from harnessrl.proxy.workers import Plan, supervise
    from harnessrl.store.reader import TraceReader

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if workers == 1:
        run(serve(build(_engine(pool), run_dir), "127.0.0.1", port))
        return 0
    run_dir.mkdir(parents=True, exist_ok=True)
    TraceReader(run_dir).close()
    return supervise(Plan.make("127.0.0.1", port, workers), _worker, (pool, run_dir))


def _engine(pool: Path):
    from load_server import PacedEngine, load_pool

    return PacedEngine(None, load_pool(pool), rate=1e9, seed=0)


def _worker(plan, index: int, pool: Path, run_dir: Path) -> None:
    from harnessrl.proxy.relay import serve_worker
    from harnessrl.proxy.serve import build, run

    run(serve_worker(build(_engine(pool), run_dir), plan, index))


def write_pool(path: Path) -> None:
    subprocess.run([sys.executable, str(HERE / "load_server.py"), "--pool", str(path),
                    "--write-pool", "--min-tokens", "8", "--max-tokens", "24"], check=True)


@contextlib.contextmanager
def server(workers: int, tmp: Path) -> Iterator[str]:
    from harnessrl.proxy.engines.vllm_server import free_port

    pool = tmp / "pool.json"
    if not pool.exists():
        write_pool(pool)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(workers), "--pool", str(pool),
         "--run-dir", str(tmp / f"run-{workers}"), "--port", str(port)],
        stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    threading.Thread(target=process.stderr.read, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_up(url, process)
        time.sleep(3.0 if workers > 1 else 0.5)  # every worker up, not only the first
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


def _wait_up(url: str, process: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the proxy at {url} did not come up")


# -------------------------------------------------------------------- the client
class _Conn(asyncio.Protocol):
    """One kept-alive connection sending the same call again as soon as it is answered."""

    def __init__(self, request: bytes, stats: dict[str, int], stop: asyncio.Event,
                 closed: asyncio.Future[None]) -> None:
        self.request, self.stats, self.stop, self.closed = request, stats, stop, closed
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:end]
            length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
            size = end + 4 + (int(length.group(1)) if length else 0)
            if len(self.buf) < size:
                return
            self.stats["ok" if head.startswith(b"HTTP/1.1 200") else "errors"] += 1
            self.buf = self.buf[size:]
            if self.stop.is_set():
                assert self.transport is not None
                self.transport.close()
                return
            assert self.transport is not None
            self.transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


def _request(base_url: str, key: str) -> bytes:
    host = base_url.split("//", 1)[1].split("/", 1)[0]
    return (f"POST /r/{key}/v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(_BODY)}\r\n\r\n").encode() + _BODY


async def _drive(url: str, mode: str, connections: int, warmup: float,
                 seconds: float) -> tuple[int, int, float, float]:
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient() as http:
        made = [(await http.post(f"{url}/rollouts", json={},
                                 headers={"Connection": "close"})).json()
                for _ in range(connections)]
    stats = {"ok": 0, "errors": 0}
    stop = asyncio.Event()
    closers = []
    for rollout in made:
        base = rollout["base_url"].rsplit("/r/", 1)[0] if mode == "owner" else url
        host, port = base.split("//", 1)[1].rsplit(":", 1)
        closed = loop.create_future()
        closers.append(closed)
        await loop.create_connection(
            lambda r=rollout, b=base, c=closed: _Conn(_request(b, r["key"]), stats, stop, c),
            host, int(port))
    await asyncio.sleep(warmup)
    ok0, err0, cpu0, t0 = stats["ok"], stats["errors"], time.process_time(), time.monotonic()
    await asyncio.sleep(seconds)
    ok1, err1, cpu1, t1 = stats["ok"], stats["errors"], time.process_time(), time.monotonic()
    stop.set()
    await asyncio.wait_for(asyncio.gather(*closers), 30)
    return ok1 - ok0, err1 - err0, t1 - t0, cpu1 - cpu0


def measure(workers: int, mode: str, args: argparse.Namespace, tmp: Path) -> Result:
    with server(workers, tmp) as url:
        ok, errors, wall, cpu = uvloop.run(_drive(url, mode, args.connections, args.warmup,
                                                  args.seconds))
    return Result(workers, mode, ok, errors, wall, cpu, os.getloadavg()[0])


# -------------------------------------------------------------------- report
def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default=f"1,{os.cpu_count() or 2}",
                    help="comma list of worker counts; the first is the baseline")
    ap.add_argument("--modes", default="owner,shared")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the server's process
    ap.add_argument("--pool", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def run_all(argv: list[str] | None) -> list[Result]:
    args = parse(argv)
    counts = [int(n) for n in args.workers.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="harnessrl-workers-") as tmp:
        for mode in args.modes.split(","):
            for n in counts:
                if n == 1 and any(r.workers == 1 for r in results):
                    continue  # one worker: the shared port is its own port
                result = measure(n, mode, args, Path(tmp))
                results.append(result)
                print(f"workers={n} mode={mode}: {result.rate:,.0f} req/s ({result.errors} "
                      f"errors, client CPU {100 * result.client_cpu / result.seconds:.0f}%, "
                      f"load {result.load:.2f})", flush=True)
    return results


def rows(argv: list[str] | None = None) -> list[Row]:
    results = run_all(argv)
    base = results[0]
    out = []
    for r in results:
        ratio = r.rate / base.rate
        label = ("own port" if r.mode == "owner" else "shared port, about (N-1)/N relayed")
        scaled = r.workers > base.workers
        out.append(Row(
            f"req/s at saturation, instant engine, {r.workers} worker(s), {label}",
            f"{r.rate:,.0f} req/s ({ratio:.2f}x; {r.errors} errors; client CPU "
            f"{100 * r.client_cpu / r.seconds:.0f}%; load {r.load:.2f})",
            f"{base.workers} worker: {base.rate:,.0f} req/s" if r is not base else "",
            f"≥ {1.7 if r.workers == 2 else 0.85 * r.workers:.2g}x" if scaled else "",
            ("PASS" if ratio >= (1.7 if r.workers == 2 else 0.85 * r.workers) else "FAIL")
            if scaled and r.mode == "owner" else ""))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.serve:
        return serve_main(args.serve, args.pool, args.run_dir, args.port)
    print("\n".join(figure_table(rows(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
