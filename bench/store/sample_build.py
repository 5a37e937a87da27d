#!/usr/bin/env python3
"""Sample building: training samples per second from a store of 10,000 turns.

A run directory is filled through `TraceStore.add_turn` with rollouts of `--turns-per`
turns each, shaped like a harness's: a ~500-token system prompt, replies of 100-300 tokens,
20-60 inserted tokens (tool results, user text) between turns, and in every fourth rollout
a rewritten history halfway (a chain break, so that path is timed too). Then, on the same
store and in the same run:

  baseline  read and decode every turn (`TraceStore.iter_turns`): the floor any consumer
            of the store pays
  samples   `harnessrl.train.rows.samples.iter_samples`: the same read plus chain linking and
            sample assembly (ids, masks, logprobs)

Each is timed `--repeat` times after one untimed pass (so the file is in the page cache
for both); the median is reported.

    .venv/bin/python bench/store/sample_build.py [--turns 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

from harnessrl.store.writer import TraceStore
from harnessrl.train.rows.samples import iter_samples
from harnessrl.types import (
    ChatRequest,
    Completion,
    Message,
    Rollout,
    Text,
    Timings,
    Tokens,
    Turn,
    Usage,
)

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "common")]  # bench/ is not a package

from table import Row, figure_table  # noqa: E402

VOCAB = 150_000


def rollout_turns(key: str, turns: int, rng: random.Random, rewrite: bool) -> Iterator[Turn]:
    prompt = [rng.randrange(VOCAB) for _ in range(500)]
    messages = [Message("system", (Text("system prompt " * 100),))]
    for index in range(turns):
        prompt += [rng.randrange(VOCAB) for _ in range(rng.randint(20, 60))]
        if rewrite and index == turns // 2:  # the harness compacted its history
            prompt[520] = (prompt[520] + 1) % VOCAB
        completion = [rng.randrange(VOCAB) for _ in range(rng.randint(100, 300))]
        messages.append(Message("user", (Text(f"tool output {index} " * 20),)))
        request = ChatRequest(model="m", messages=tuple(messages))
        text = "reply " * (len(completion) // 2)
        yield Turn(
            rollout=key, index=index, dialect="openai_chat", status="ok",
            timings=Timings(time.time(), time.time(), time.time()),
            raw_request=msgspec.json.encode(request), raw_response=text.encode() * 3,
            request=request, engine="bench", model="m", reply_id=f"chatcmpl-{key}-{index}",
            completion=Completion(
                model="m", parts=(Text(text),), finish_reason="stop",
                usage=Usage(len(prompt), len(completion)),
                tokens=Tokens(tuple(prompt), tuple(completion),
                              tuple(-0.01 * (i % 9) for i in range(len(completion))))))
        messages.append(Message("assistant", (Text(text),)))
        prompt = prompt + completion


async def fill(store: TraceStore, turns: int, per: int, seed: int) -> int:
    rng, made = random.Random(seed), 0
    for r in range(-(-turns // per)):
        key = f"bench-{r:05d}"
        await store.put_rollout(Rollout(key=key, created=time.time()))
        batch = list(rollout_turns(key, min(per, turns - made), rng, rewrite=r % 4 == 3))
        await asyncio.gather(*(store.add_turn(t) for t in batch))
        made += len(batch)
    return made


def timed(work: Callable[[], int], repeat: int) -> tuple[float, int]:
    count = work()  # untimed: page cache and imports warm for every timed pass
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times), count


def measure(turns: int, per: int, repeat: int, seed: int = 0) -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="harnessrl-samples-"))
    try:
        with TraceStore(root / "run") as store:
            started = time.perf_counter()
            made = asyncio.run(fill(store, turns, per, seed))
            fill_s = time.perf_counter() - started
            read_s, read_n = timed(lambda: sum(1 for _ in store.iter_turns()), repeat)
            build_s, samples = timed(lambda: sum(1 for _ in iter_samples(store)), repeat)
            size = (root / "run" / "trace.db").stat().st_size
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert read_n == made
    return [
        Row("samples built per second (train.rows.samples.iter_samples)",
            f"{samples / build_s:,.0f} samples/s = {made / build_s:,.0f} turns/s "
            f"({build_s:.2f} s, {build_s / read_s:.2f}x the read)",
            f"reading and decoding the turns only: {made / read_s:,.0f} turns/s "
            f"({read_s:.2f} s)", "", ""),
        Row("store built for it", f"{made:,} turns, {samples:,} samples, "
            f"{size / 2**20:,.0f} MiB", f"written in {fill_s:.1f} s "
            f"({made / fill_s:,.0f} turns/s through add_turn)", "", ""),
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=10_000)
    ap.add_argument("--turns-per", type=int, default=10, help="turns per rollout")
    ap.add_argument("--repeat", type=int, default=3)
    return ap.parse_args(argv)


def rows(argv: list[str] | None = None) -> list[Row]:
    """The runner's rows (bench/run.py)."""
    args = parse_args(argv)
    return measure(args.turns, args.turns_per, args.repeat)


def main(argv: list[str] | None = None) -> int:
    print("\n".join(figure_table(rows(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
