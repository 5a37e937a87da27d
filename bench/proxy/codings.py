#!/usr/bin/env python3
"""Request content codings (`proxy/wire/codings.py`): what the cap costs, in one run.

  decode   a chat body of 16 KiB, 256 KiB and 4 MiB (distinct words, so it compresses
           like real history, ~2.6x) coded as zstd (level 3), gzip and br (quality 5):
           the proxy's capped, streamed decode against the library's own one-shot
           decode (unbounded: what a bomb would make it allocate), best of N
  bomb     (zstd_bomb.py) a zstd frame of 1 GiB of zeros decoded under the proxy's 32 MiB limit: its
           size, the time until it is refused, and the process's peak memory before and
           after (a fresh process)

    .venv/bin/python bench/proxy/codings.py
"""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import brotli
import zstandard

from harnessrl.proxy.wire import codings

LIMIT = 64 << 20
BOMB = Path(__file__).with_name("zstd_bomb.py")


def chat_body(kib: int, rng: random.Random) -> bytes:
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(5000)]
    messages, size = [], 0
    while size < kib * 1024:
        text = " ".join(rng.choice(words) for _ in range(200))
        messages.append({"role": "user", "content": text})
        size += len(text)
    return json.dumps({"model": "m", "input": messages}).encode()


def best(work: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def decode_table() -> None:
    rng = random.Random(0)
    print("| body | coding | coded | capped decode | one-shot decode | ratio |")
    print("|---|---|---|---|---|---|")
    for kib in (16, 256, 4096):
        body = chat_body(kib, rng)
        n = max(15, 2000 // kib)
        cases = [
            ("zstd", zstandard.ZstdCompressor(level=3).compress(body),
             lambda c: zstandard.ZstdDecompressor().decompressobj().decompress(c)),
            ("gzip", gzip.compress(body), gzip.decompress),
            ("br", brotli.compress(body, quality=5), brotli.decompress),
        ]
        for name, coded, oneshot in cases:
            ours = best(lambda c=coded, n_=name: codings.decode(c, (n_,), LIMIT), n)
            theirs = best(lambda c=coded, f=oneshot: f(c), n)
            print(f"| {len(body) / 1024:.0f} KiB | {name} | {len(coded) / 1024:.0f} KiB | "
                  f"{ours * 1e3:.2f} ms | {theirs * 1e3:.2f} ms | {ours / theirs:.2f}x |")


def bomb() -> None:
    done = subprocess.run([sys.executable, str(BOMB)], capture_output=True, text=True,
                          check=True)
    size, took, before, after = done.stdout.split()
    print(f"\nzstd bomb: {int(size) / 1024:.0f} KiB frame of 1 GiB of zeros, refused as too "
          f"large after {float(took) * 1e3:.0f} ms under a 32 MiB limit; peak RSS "
          f"{int(before) / 1024:.0f} -> {int(after) / 1024:.0f} MiB")


def main() -> None:
    decode_table()
    bomb()


if __name__ == "__main__":
    main()
