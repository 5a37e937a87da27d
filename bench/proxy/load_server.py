#!/usr/bin/env python3
"""The proxy as `bench/proxy/load.py` drives it: its own process, a paced scripted engine, and an
event-loop lag probe. Bench-only, so the production server carries no probe.

The engine is `ScriptedEngine` with its two costly steps taken out of the measurement: the
replies are a fixed pool tokenized once at start (the tiny model's tokenizer, real ids and
real detokenized pieces), and the prompt is "tokenized" by hashing words. In chat mode vLLM
renders and tokenizes the prompt, not the proxy, so neither belongs to the proxy's cost.
Tokens leave at `--rate` per second per stream, on an absolute schedule, so a late wake-up
does not slow the stream down further.

    .venv/bin/python bench/proxy/load_server.py --pool pool.json --write-pool
    .venv/bin/python bench/proxy/load_server.py --pool pool.json --port 8123 --run-dir /tmp/run

Bench-only routes: GET /_bench/lag (lag percentiles since the last reset), POST
/_bench/lag/reset.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sys
from array import array
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from harnessrl.proxy.engines.scripted import Reply, ScriptedEngine, default_logprob, detokenize
from harnessrl.proxy.serve import build, run, serve
from harnessrl.types import (
    ChatRequest,
    Chunk,
    EngineEvent,
    Finished,
    Started,
    Text,
    TextDelta,
    Usage,
)

WORDS = ("the", "model", "reads", "a", "file", "then", "edits", "function", "and", "runs",
         "tests", "again", "until", "every", "check", "passes", "with", "no", "error", "left",
         "in", "output", "of", "this", "small", "repository", "where", "each", "module", "has",
         "one", "job", "short", "name")
_ROLE_IDS = {"system": 1, "user": 2, "assistant": 3, "tool": 4}
_VOCAB = 100_000


# ------------------------------------------------------------------ lag probe
class LagProbe:
    """Wakes every `interval` s and records how late it woke, in a fixed histogram (0.1 ms
    buckets up to 1 s, 10 ms buckets up to 60 s), so the probe's own memory does not grow
    over a long run."""

    FINE_MS, FINE = 0.1, 10_000  # up to 1 s
    COARSE_MS, COARSE = 10.0, 5_900  # 1 s to 60 s; later wake-ups land in the last bucket

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.counts = array("q", bytes(8 * (self.FINE + self.COARSE)))
        self.worst = 0.0

    def reset(self) -> None:
        self.counts = array("q", bytes(8 * (self.FINE + self.COARSE)))
        self.worst = 0.0

    def bucket(self, lag_ms: float) -> int:
        if lag_ms < self.FINE * self.FINE_MS:
            return int(lag_ms / self.FINE_MS)
        coarse = int((lag_ms - self.FINE * self.FINE_MS) / self.COARSE_MS)
        return self.FINE + min(self.COARSE - 1, coarse)

    def upper_edge(self, bucket: int) -> float:
        if bucket < self.FINE:
            return (bucket + 1) * self.FINE_MS
        return self.FINE * self.FINE_MS + (bucket - self.FINE + 1) * self.COARSE_MS

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.interval)
            lag_ms = max(0.0, (loop.time() - start - self.interval) * 1000)
            self.counts[self.bucket(lag_ms)] += 1
            self.worst = max(self.worst, lag_ms)

    def summary(self) -> dict[str, float]:
        total = sum(self.counts)
        out = {"samples": float(total), "max_ms": self.worst, "interval_ms": self.interval * 1e3}
        for name, q in (("p50_ms", 0.50), ("p99_ms", 0.99), ("p999_ms", 0.999)):
            out[name] = self._quantile(q, total)
        return out

    def _quantile(self, q: float, total: int) -> float:
        if not total:
            return float("nan")
        rank, seen = q * total, 0
        for bucket, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return min(self.upper_edge(bucket), self.worst)  # the bucket's upper edge
        return self.worst


def with_probe(app: Any, probe: LagProbe) -> Any:
    """The proxy's ASGI app plus two bench routes; everything else passes through."""
    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not path.startswith("/_bench/"):
            return await app(scope, receive, send)
        if path == "/_bench/lag/reset":
            probe.reset()
        body = msgspec.json.encode(probe.summary())
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
        return None
    return wrapped


# ------------------------------------------------------------------ engine
@dataclass(frozen=True)
class Prepared:
    text: str
    ids: tuple[int, ...]
    pieces: tuple[str, ...]
    logprobs: tuple[float, ...]


def reply_pool(tokenizer: Any, size: int, lengths: tuple[int, int], seed: int
               ) -> list[dict[str, list]]:
    """Replies of random lengths in `lengths` tokens: ids and the text each id adds."""
    rng = random.Random(seed)
    pool = []
    for _ in range(size):
        want = rng.randint(*lengths)
        words = " ".join(rng.choice(WORDS) for _ in range(want))
        ids = tokenizer.encode(words, add_special_tokens=False)[:want - 1]
        ids.append(tokenizer.eos_token_id)
        pool.append({"ids": ids, "pieces": detokenize(tokenizer, ids)})
    return pool


def load_pool(path: Path) -> list[Prepared]:
    return [Prepared("".join(r["pieces"]), tuple(r["ids"]), tuple(r["pieces"]),
                     tuple(default_logprob(i) for i in range(len(r["ids"]))))
            for r in msgspec.json.decode(path.read_bytes())]


class PacedEngine(ScriptedEngine):
    """ScriptedEngine replaying a pre-tokenized pool at a fixed token rate per stream."""

    def __init__(self, tokenizer: Any, pool: list[Prepared], rate: float, seed: int) -> None:
        rng = random.Random(seed)
        super().__init__(tokenizer, lambda _request: Reply(rng.choice(pool).text))
        self.by_text = {p.text: p for p in pool}
        self.rate = rate

    def render_prompt(self, request: ChatRequest) -> list[int]:
        ids: list[int] = []
        for message in request.messages:
            ids.append(_ROLE_IDS.get(message.role, 5))
            for part in message.parts:
                if isinstance(part, Text):
                    ids.extend(hash(w) % _VOCAB + 10 for w in part.text.split())
        return ids

    async def _events(self, request: ChatRequest, *, one_chunk: bool
                      ) -> AsyncGenerator[EngineEvent, None]:
        self.calls += 1
        reply = self.by_text[self.policy(request).text]
        prompt = self.render_prompt(request)
        yield Started(self.model, tuple(prompt))
        if one_chunk:
            yield Chunk((TextDelta(reply.text),), reply.ids, reply.logprobs)
        else:
            loop = asyncio.get_running_loop()
            start = loop.time()
            for i, (piece, token, logprob) in enumerate(
                    zip(reply.pieces, reply.ids, reply.logprobs, strict=True)):
                if (delay := start + i / self.rate - loop.time()) > 0:
                    await asyncio.sleep(delay)
                yield Chunk((TextDelta(piece),) if piece else (), (token,), (logprob,))
        yield Finished("stop", Usage(len(prompt), len(reply.ids)))


# ------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int)
    ap.add_argument("--run-dir", type=Path)
    ap.add_argument("--pool", type=Path, required=True, help="the reply pool (JSON)")
    ap.add_argument("--write-pool", action="store_true",
                    help="build the pool with the tiny model's tokenizer, write it, exit")
    ap.add_argument("--rate", type=float, default=40.0, help="tokens/s per stream")
    ap.add_argument("--min-tokens", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=300)
    ap.add_argument("--pool-size", type=int, default=64, help="distinct replies")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def write_pool(args: argparse.Namespace) -> None:
    # In its own process: transformers' import alone would add hundreds of MiB and
    # millions of objects for the garbage collector to the proxy under measurement.
    from harnessrl.rollout.conformance import policy_tokenizer

    pool = reply_pool(policy_tokenizer(), args.pool_size, (args.min_tokens, args.max_tokens),
                      args.seed)
    args.pool.write_bytes(msgspec.json.encode(pool))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.write_pool:
        write_pool(args)
        return 0
    engine = PacedEngine(None, load_pool(args.pool), args.rate, args.seed)
    proxy = build(engine, args.run_dir)
    probe = LagProbe()

    def on_server(server: Any) -> None:
        signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))

    async def main_loop() -> None:
        task = asyncio.create_task(probe.run())
        try:
            await serve(proxy, "127.0.0.1", args.port, wrap=lambda app: with_probe(app, probe),
                        on_server=on_server)
        finally:
            task.cancel()

    run(main_loop())
    return 0


if __name__ == "__main__":
    sys.exit(main())
