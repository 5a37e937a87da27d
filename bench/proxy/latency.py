#!/usr/bin/env python3
"""What the proxy adds to a call's latency at c=1, with one raw HTTP client on both sides:
the engine called directly against each dialect through the proxy, calls interleaved.

bench/proxy/proxy_overhead.py measures the same through each dialect's own SDK (as the anchor
benchmark does), so there a dialect's figure includes its SDK's cost against the openai
SDK's. Here the client is the same aiohttp loop for every side, so the difference is the
proxy's own: request parsing, the engine call, re-encoding, the store's commit.

Two more sides split the figure:
- `capture` calls the engine directly with the request the proxy sends it (the same chat
  body plus `logprobs` and `return_token_ids`, as `openai_wire.chat_body` asks). Its
  answer carries every prompt id and a logprob per token, ~40 KB against ~2 KB, and the
  engine takes longer to make it: that part is the engine's work for capture.
- `relay` sends the plain call through a TCP relay that only copies bytes
  (`floor_relay.py --server tcp`): what the two more socket hops alone cost.

- non-streamed: the whole answer (engine at 0 ms per token, 200 tokens, a ~4,000-token
  prompt);
- streamed: time to the first token, the first byte of the dialect's first text event
  (engine at `--delay-ms` per token, so the first token comes apart from the role chunk;
  20 tokens a reply).

    .venv/bin/python bench/proxy/latency.py [--calls 100] [--dialects chat,gemini]
    .venv/bin/python bench/proxy/latency.py --baseline HEAD~1   # and a revision's proxy beside it
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "common")]  # bench/ is not a package

import proxy_overhead as po  # noqa: E402
import stream_cpu  # noqa: E402
from table import Row, figure_table, verdict  # noqa: E402

DIALECTS = ("chat", "responses", "anthropic", "gemini")
# The first bytes of each dialect's first event that carries a token's text.
FIRST_TEXT = {"chat": b'"content":"',
              "responses": b"response.output_text.delta", "anthropic": b"content_block_delta",
              "gemini": b'"text":'}
_EMPTY = b'"content":""'  # the role chunk's
CAPTURE = stream_cpu.CAPTURE  # what the proxy adds to a chat body for the engine


@dataclass(frozen=True)
class Target:
    """One side: where its calls go (the path is appended), in which dialect, and what is
    added to each body."""

    base: str
    dialect: str = "chat"
    extra: dict[str, Any] = field(default_factory=dict)


async def one(http: aiohttp.ClientSession, url: str, body: bytes, marker: bytes | None
              ) -> float:
    """Seconds to the whole answer (`marker` None) or to the first byte of `marker`."""
    start = time.perf_counter()
    async with http.post(url, data=body, headers={"content-type": "application/json"}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status} {(await resp.read())[:300]!r}")
        if marker is None:
            await resp.read()
            return time.perf_counter() - start
        seen, at = b"", None
        async for piece in resp.content.iter_any():
            seen += piece
            if at is None and marker in seen.replace(_EMPTY, b""):
                at = time.perf_counter() - start
        if at is None:
            raise RuntimeError(f"{url}: no {marker!r} in the stream")
        return at


async def measure_async(engine_url: str, targets: dict[str, Target], calls: int,
                        delay_ms: float) -> dict[str, dict[str, list[float]]]:
    times: dict[str, dict[str, list[float]]] = {"json": {}, "sse": {}}
    async with aiohttp.ClientSession() as http:
        # Streamed calls stop mattering at their first token: 20 tokens keep them short.
        for mode, tokens, delay in (("json", stream_cpu.TOKENS, 0.0), ("sse", 20, delay_ms)):
            async with http.post(f"{engine_url}/config", data=json.dumps(
                    {"tokens": tokens, "delay_ms": delay})) as configured:
                await configured.read()
            stream = mode == "sse"
            for n in range(calls + 5):  # the first 5 of each side warm up
                for side, target in targets.items():
                    path, body = stream_cpu.request(target.dialect, stream, n)
                    took = await one(http, f"{target.base}{path}",
                                     json.dumps({**body, **target.extra}).encode(),
                                     FIRST_TEXT[target.dialect] if stream else None)
                    if n >= 5:
                        times[mode].setdefault(side, []).append(took)
    return times


def measure(argv: Sequence[str] | None = None) -> dict[str, dict[str, list[float]]]:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="latency-") as tmp:
        work = Path(tmp)
        engine, engine_url = po.start_engine(args.tools_dir, work)
        proxy = stream_cpu.Side("this", stream_cpu.ROOT / "src")
        relay = stream_cpu.Side("relay", stream_cpu.ROOT / "src", floor="tcp")
        sides = [proxy, relay]
        if args.baseline:  # another revision's proxy, its calls interleaved with ours
            sides.append(stream_cpu.Side(
                "baseline", stream_cpu.baseline_src(args.baseline, work)))
        try:
            for side in sides:
                side.start(engine_url, work)

            async def run() -> dict[str, dict[str, list[float]]]:
                async with aiohttp.ClientSession() as http:
                    keys = {side.name: await stream_cpu.new_key(http, side)
                            for side in sides if not side.floor}
                dialects = args.dialects.split(",")
                targets = {"direct": Target(engine_url),
                           "capture": Target(engine_url, extra=CAPTURE),
                           "relay": Target(relay.url),
                           **{d: Target(f"{proxy.url}/r/{keys['this']}", d) for d in dialects}}
                if args.baseline:
                    targets.update({f"{d} at {args.baseline}": Target(
                        f"{sides[2].url}/r/{keys['baseline']}", d) for d in dialects})
                return await measure_async(engine_url, targets, args.calls, args.delay_ms)

            return asyncio.run(run())
        finally:
            for side in sides:
                side.stop()
            engine.stop()


def rows(argv: Sequence[str] | None = None) -> list[Row]:
    out = []
    for mode, found in measure(argv).items():
        direct = statistics.median(found.pop("direct")) * 1e3
        capture = statistics.median(found.pop("capture")) * 1e3
        relay = statistics.median(found.pop("relay")) * 1e3
        what = ("latency added p50, non-streamed" if mode == "json"
                else "time to first token added p50, streamed")
        out.append(Row(f"{what}: two more socket hops alone (a TCP relay that copies "
                       "bytes, bench/proxy/floor_relay.py --server tcp), c=1",
                       f"{relay - direct:+.2f} ms",
                       f"engine called directly: p50 {direct:.2f} ms", "", ""))
        out.append(Row(f"{what}: the engine's own part, answering the capture request "
                       "(logprobs, prompt and reply ids) directly, c=1",
                       f"{capture - direct:+.2f} ms",
                       f"engine called directly: p50 {direct:.2f} ms", "", ""))
        for dialect, values in found.items():
            added = statistics.median(values) * 1e3 - direct
            judged = " at " not in dialect  # a baseline's rows are for comparison
            out.append(Row(f"{what}, {dialect}, c=1, raw HTTP client (no SDK)",
                           f"{added:+.2f} ms ({added - capture + direct:+.2f} ms over the "
                           "capture request)", f"engine called directly: p50 {direct:.2f} ms",
                           "≤ 1 ms" if judged else "", verdict(added <= 1.0) if judged else ""))
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dialects", default=",".join(DIALECTS))
    ap.add_argument("--calls", type=int, default=100, help="calls per side and mode")
    ap.add_argument("--delay-ms", type=float, default=5.0,
                    help="engine's time per token in the streamed calls")
    ap.add_argument("--tools-dir", type=Path, default=po.DEFAULT_TOOLS)
    ap.add_argument("--baseline", default="",
                    help="also a proxy at this revision (git archive), calls interleaved")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    print("\n".join(figure_table(rows(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
