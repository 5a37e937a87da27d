#!/usr/bin/env python3
"""A zstd bomb against the proxy's decoder (`proxy/wire/codings.py`), in a process of its
own, since its peak memory is the figure: a ~32 KiB frame of 1 GiB of zeros decoded under a
32 MiB limit. Prints the frame's size in bytes, the seconds until it was refused, and the
process's peak RSS in KiB before and after the decode; exits 1 if it was not refused.
bench/proxy/codings.py prints it as a figure, tests/test_codings.py checks it.

    .venv/bin/python bench/proxy/zstd_bomb.py
"""

from __future__ import annotations

import resource
import sys
import time

import zstandard

from harnessrl.errors import TooLarge
from harnessrl.proxy.wire.codings import decode

LIMIT = 32 << 20


def main() -> int:
    out = zstandard.ZstdCompressor(level=3).compressobj()
    zeros = b"\0" * (1 << 24)
    frame = b"".join([out.compress(zeros) for _ in range(64)] + [out.flush()])
    del zeros
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    try:
        decode(frame, ("zstd",), LIMIT)
    except TooLarge:
        took = time.perf_counter() - start
    else:
        print("a 1 GiB zstd frame was decoded under a 32 MiB limit", file=sys.stderr)
        return 1
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(len(frame), f"{took:.6f}", before, after)
    return 0


if __name__ == "__main__":
    sys.exit(main())
