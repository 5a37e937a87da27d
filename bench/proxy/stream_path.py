#!/usr/bin/env python3
"""The proxy's own CPU per streamed token and per call, without sockets: the real app
(Starlette routing, the dialect, the vLLM engine's stream parser, the accumulator, the
store) driven in-process by raw ASGI calls, with the engine's HTTP answer replaced by
recorded vLLM SSE bytes (one read per token, as a 2 ms/token engine arrives). What is left
out is what the proxy does not own here: uvicorn, the socket reads, the kernel.

    .venv/bin/python bench/proxy/stream_path.py                      # this checkout vs 9b86db5
    .venv/bin/python bench/proxy/stream_path.py --baseline HEAD~2 --rounds 5

Each side runs in its own process (`--src` on PYTHONPATH), alternating rounds, so the
machine's load hits both alike; the figure is the median round, the ratio this/baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "common")]  # bench/ is not a package

ROOT = HERE.parents[1]
TOKENS = 200
STREAMS = (True, False)
DIALECTS = ("chat", "responses", "anthropic", "gemini")
WORDS = (" the", " value", " of", " file", " return", " self", " data", " token", " import")


def vllm_stream(prompt_ids: int = 4000, tokens: int = TOKENS) -> list[bytes]:
    """vLLM's SSE answer as the reads it arrives in: one per token."""
    head = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1,
            "model": "bench-model"}

    def event(body: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps({**head, **body}, separators=(",", ":")).encode() + b"\n\n"

    reads = [event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                 "logprobs": None, "finish_reason": None}],
                    "prompt_token_ids": list(range(1000, 1000 + prompt_ids))})]
    for i in range(tokens):
        word = WORDS[i % len(WORDS)]
        reads.append(event({"choices": [{
            "index": 0, "delta": {"content": word},
            "logprobs": {"content": [{"token": f"token_id:{500 + i}", "logprob": -0.05 * i,
                                      "bytes": list(word.encode()), "top_logprobs": []}]},
            "finish_reason": "stop" if i == tokens - 1 else None, "token_ids": [500 + i]}]}))
    reads.append(event({"choices": [], "usage": {"prompt_tokens": prompt_ids,
                                                 "completion_tokens": tokens,
                                                 "total_tokens": prompt_ids + tokens}})
                 + b"data: [DONE]\n\n")
    return reads


def vllm_answer(prompt_ids: int = 4000, tokens: int = TOKENS) -> bytes:
    words = [WORDS[i % len(WORDS)] for i in range(tokens)]
    return json.dumps({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": "bench-model",
        "prompt_token_ids": list(range(1000, 1000 + prompt_ids)),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(words)},
                     "finish_reason": "stop", "token_ids": list(range(500, 500 + tokens)),
                     "logprobs": {"content": [
                         {"token": f"token_id:{500 + i}", "logprob": -0.01 * i,
                          "bytes": list(w.encode()), "top_logprobs": []}
                         for i, w in enumerate(words)]}}],
        "usage": {"prompt_tokens": prompt_ids, "completion_tokens": tokens,
                  "total_tokens": prompt_ids + tokens}}, separators=(",", ":")).encode()


class _Content:
    def __init__(self, reads: list[bytes]) -> None:
        self._reads = reads
        self._at = 0

    async def iter_any(self) -> AsyncIterator[bytes]:
        for piece in self._reads:
            yield piece

    async def readany(self) -> bytes:
        """aiohttp's: what arrived, one read at a time; b"" at the end of the body."""
        self._at += 1
        return self._reads[self._at - 1] if self._at <= len(self._reads) else b""

    async def read(self) -> bytes:
        return b"".join(self._reads)


class _Answer:
    status = 200

    def __init__(self, reads: list[bytes]) -> None:
        self.content = _Content(reads)  # how an aiohttp answer reads (baselines before 048132d)
        self.readany = self.content.readany  # how an http.client.Response (ours) does

    async def read(self) -> bytes:
        return await self.content.read()

    def pace(self, interval: float) -> None:
        """Its reads are already as the bench groups them."""

    def release(self) -> None:
        pass


async def asgi_call(app: Any, path: str, query: bytes, body: bytes) -> int:
    """One POST through the ASGI app; the bytes of the response body."""
    sent = 0
    done = asyncio.Event()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal sent
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise RuntimeError(f"{path}: HTTP {message['status']}")
        if message["type"] == "http.response.body":
            sent += len(message.get("body", b""))
            if not message.get("more_body", False):
                done.set()

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
             "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": query, "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"host", b"127.0.0.1")],
             "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 5000)}
    await app(scope, receive, send)
    return sent


@contextlib.asynccontextmanager
async def replayed_app() -> AsyncIterator[tuple[Any, str]]:
    """The real app on a vLLM engine whose answers are replayed (`vllm_stream` one read per
    token, `vllm_answer` whole), and a rollout key: (app, key)."""
    from harnessrl.proxy.engines.upstream import Upstream
    from harnessrl.proxy.engines.vllm import VLLMEngine
    from harnessrl.proxy.serve import build

    stream_reads, answer = vllm_stream(), vllm_answer()

    @contextlib.asynccontextmanager
    async def begun(_self: Any, _url: str, payload: bytes) -> AsyncIterator[_Answer]:
        yield _Answer(stream_reads if b'"stream":true' in payload else [answer])

    Upstream._begun = begun  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        proxy = build(VLLMEngine("http://127.0.0.1:9"), Path(tmp))
        with proxy.store:
            proxy.served = ["bench-model"]
            yield proxy.app(), (await proxy.sessions.create()).key


async def side_rounds(dialects: Sequence[str], calls: int, rounds: int) -> dict[str, Any]:
    from stream_cpu import request  # the same bodies as the socket bench

    out: dict[str, Any] = {}
    async with replayed_app() as (app, key):
        nonce = 0
        for stream in STREAMS:
            mode = "sse" if stream else "json"
            for dialect in dialects:
                samples = []
                for r in range(rounds + 1):
                    # Encoded before the clock starts: the client's json.dumps of a 4k-token
                    # body (~0.1 ms) is not the proxy's.
                    encoded = []
                    for _ in range(calls):
                        nonce += 1
                        path, body = request(dialect, stream, nonce)
                        route, _, query = path.partition("?")
                        encoded.append((f"/r/{key}{route}", query.encode(),
                                        json.dumps(body).encode()))
                    t0 = time.process_time()
                    for call in encoded:
                        await asgi_call(app.router, *call)
                    if r:  # round 0 warms up
                        samples.append((time.process_time() - t0) / calls * 1e6)
                out[f"{dialect}/{mode}"] = samples
    return out


def run_side(src: Path, dialects: Sequence[str], calls: int, rounds: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{HERE}"}
    argv = [sys.executable, str(Path(__file__).resolve()), "--side",
            "--dialects", ",".join(dialects), "--calls", str(calls), "--rounds", str(rounds)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"side {src} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    from stream_cpu import baseline_src

    args = parse_args(argv)
    dialects = args.dialects.split(",")
    with tempfile.TemporaryDirectory(prefix="stream-path-") as tmp:
        base_src = baseline_src(args.baseline, Path(tmp))
        this: dict[str, list[float]] = {}
        base: dict[str, list[float]] = {}
        for _ in range(args.repeats):  # alternate the sides
            for into, src in ((this, ROOT / "src"), (base, base_src)):
                for k, v in run_side(src, dialects, args.calls, args.rounds).items():
                    into.setdefault(k, []).extend(v)
    return [{"case": k, "this_us": statistics.median(v), "base_us": statistics.median(base[k]),
             "ratio": statistics.median(v) / statistics.median(base[k]),
             "baseline": args.baseline} for k, v in this.items()]


def rows(argv: Sequence[str] | None = None) -> list[Any]:
    from table import Row

    found = measure(argv)
    out = []
    for f in found:
        dialect, mode = f["case"].split("/")
        if mode == "sse":
            out.append(Row(f"in-process CPU per streamed token, {dialect} (no sockets)",
                           f"{f['this_us'] / TOKENS:.1f} µs",
                           f"{f['base_us'] / TOKENS:.1f} µs at {f['baseline']}; ratio "
                           f"{f['ratio']:.2f}"))
        else:
            out.append(Row(f"in-process CPU per non-streamed 4k-token call, {dialect}",
                           f"{f['this_us'] / 1e3:.2f} ms",
                           f"{f['base_us'] / 1e3:.2f} ms at {f['baseline']}; ratio "
                           f"{f['ratio']:.2f}"))
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="9b86db5")
    ap.add_argument("--dialects", default=",".join(DIALECTS))
    ap.add_argument("--calls", type=int, default=10, help="calls per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per side process")
    ap.add_argument("--repeats", type=int, default=2, help="side processes per side")
    ap.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.side:
        print(json.dumps(asyncio.run(side_rounds(args.dialects.split(","), args.calls,
                                                 args.rounds))))
        return 0
    found = measure(argv)
    print(f"| case | this µs/call | {found[0]['baseline']} µs/call | ratio | µs/token (sse) |")
    print("|---|---|---|---|---|")
    for f in found:
        tok = (f"{f['this_us'] / TOKENS:.1f} vs {f['base_us'] / TOKENS:.1f}"
               if f["case"].endswith("sse") else "")
        print(f"| {f['case']} | {f['this_us']:.0f} | {f['base_us']:.0f} | {f['ratio']:.2f} "
              f"| {tok} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
