#!/usr/bin/env python3
"""The proxy's memory per open rollout: idle (made, never called) and after 100 turns, each
turn's request carrying the whole conversation so far, as an agent's does.

One `harnessrl serve` on the fake vLLM (`../shared/tools/bench_engine.py`, 0 ms per token,
24-token replies). After a warm-up (imports, caches, the first allocations), RSS is read
from /proc before and after making `--idle` rollouts, then before and after driving
`--busy` rollouts through `--turns` turns each, twice: the second round is what each more
rollout costs. The baseline is the proxy's RSS after its warm-up, in the same run.

    .venv/bin/python bench/proxy/rollout_memory.py [--idle 2000] [--busy 16] [--turns 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "common")]  # bench/ is not a package

import proxy_overhead as po  # noqa: E402
import stream_cpu  # noqa: E402
from table import Row, figure_table  # noqa: E402

REPLY_TOKENS = 24


async def _rollout(http: aiohttp.ClientSession, url: str) -> str:
    async with http.post(f"{url}/rollouts", data=b"{}") as resp:
        return (await resp.json())["key"]


async def _conversation(http: aiohttp.ClientSession, url: str, key: str, turns: int) -> None:
    """`turns` calls, each with every earlier message and the reply it got."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for n in range(turns):
        messages.append({"role": "user", "content": f"step {n}: run the tests and fix one"})
        body = {"model": "bench-model", "max_tokens": 64, "messages": messages}
        async with http.post(f"{url}/r/{key}/v1/chat/completions", data=json.dumps(body),
                             headers={"content-type": "application/json"}) as resp:
            if resp.status != 200:
                raise RuntimeError(f"turn {n}: HTTP {resp.status} {await resp.text()}")
            reply = (await resp.json())["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": reply})


async def measure_async(engine_url: str, url: str, pid: int, args: argparse.Namespace
                        ) -> dict[str, float]:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{engine_url}/config", data=json.dumps(
                {"tokens": REPLY_TOKENS, "delay_ms": 0})) as resp:
            await resp.read()
        warm = [await _rollout(http, url) for _ in range(50)]
        await asyncio.gather(*(_conversation(http, url, key, 20) for key in warm[:4]))
        found = {"warm": po.rss_mib(pid)}
        for _ in range(args.idle):
            await _rollout(http, url)
        found["idle"] = po.rss_mib(pid)
        # Two rounds of --busy rollouts: the first also pays for the allocator's high-water
        # mark of the longest requests, once; the second is what each more rollout costs.
        for name in ("first", "second"):
            busy = [await _rollout(http, url) for _ in range(args.busy)]
            found[f"{name}_made"] = po.rss_mib(pid)
            for start in range(0, len(busy), 4):  # four conversations at a time
                await asyncio.gather(*(_conversation(http, url, key, args.turns)
                                       for key in busy[start:start + 4]))
            found[name] = po.rss_mib(pid)
    return found


def measure(argv: Sequence[str] | None = None) -> tuple[dict[str, float], argparse.Namespace]:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rollout-memory-") as tmp:
        work = Path(tmp)
        engine, engine_url = po.start_engine(args.tools_dir, work)
        proxy = stream_cpu.Side("this", stream_cpu.ROOT / "src")
        try:
            proxy.start(engine_url, work)
            assert proxy.proxy is not None
            found = asyncio.run(measure_async(engine_url, proxy.url, proxy.proxy.pid, args))
        finally:
            proxy.stop()
            engine.stop()
    return found, args


def rows(argv: Sequence[str] | None = None) -> list[Row]:
    found, args = measure(argv)
    base = f"proxy RSS after warm-up {found['warm']:.1f} MiB"
    idle = (found["idle"] - found["warm"]) * 1024 / args.idle
    first = found["first"] - found["first_made"]
    busy = (found["second"] - found["second_made"]) * 1024 / args.busy
    return [
        Row(f"memory per idle open rollout ({args.idle:,} made)", f"{idle:.1f} KiB",
            f"{base}; {found['idle']:.1f} MiB after", "≤ 20 KiB",
            "PASS" if idle <= 20 else "FAIL"),
        Row(f"memory per rollout after {args.turns} turns, on top of its idle cost "
            f"(a second round of {args.busy} rollouts, {args.busy * args.turns:,} turns, "
            "each request the whole conversation)", f"{busy:.1f} KiB",
            f"{base}; the first round of {args.busy} added {first:.1f} MiB (the allocator's "
            f"high-water mark for the longest requests, once); {found['second']:.1f} MiB "
            "after both", "small, flat", ""),
    ]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--idle", type=int, default=2000, help="idle rollouts to make")
    ap.add_argument("--busy", type=int, default=16, help="rollouts driven through --turns")
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--tools-dir", type=Path, default=po.DEFAULT_TOOLS)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    print("\n".join(figure_table(rows(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
