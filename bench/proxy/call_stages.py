#!/usr/bin/env python3
"""Where a non-streamed call's proxy CPU goes, stage by stage, per dialect: the same ~4,000-
token call `bench/proxy/stream_cpu.py` and `bench/proxy/stream_path.py` measure whole.

Each stage is the proxy's own function on that call's real input, run `--repeats` times in
this process (CPU time, after a warm-up); the store's write is the row encoded on the
caller's thread plus its writer thread's commit, per turn, awaited one turn at a time.
The baseline is the whole call in-process (the real app driven by raw ASGI calls, as
stream_path.py does): what the stages leave out of it is routing, the ASGI plumbing and
the event loop.

    .venv/bin/python bench/proxy/call_stages.py [--dialects chat,gemini] [--repeats 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "common")]  # bench/ is not a package

from table import Row, figure_table  # noqa: E402

DIALECTS = {"chat": "openai_chat", "responses": "openai_responses", "anthropic": "anthropic",
            "gemini": "gemini"}


def _timed(fn: Callable[[], object], repeats: int) -> float:
    """µs of CPU per run of `fn`."""
    for _ in range(max(3, repeats // 10)):
        fn()
    t0 = time.process_time()
    for _ in range(repeats):
        fn()
    return (time.process_time() - t0) / repeats * 1e6


PACKING = "the turn packed into its row (rows.turn_row)"


def _call(dialect_name: str) -> dict[str, Any]:
    """One non-streamed call's inputs and intermediate values, each as the proxy makes it."""
    import msgspec
    from stream_cpu import request
    from stream_path import vllm_answer

    from harnessrl.proxy.dialects import DIALECTS as ALL
    from harnessrl.proxy.dialects.base import ReplyContext
    from harnessrl.proxy.engines.vllm import _events_from_completion
    from harnessrl.proxy.wire.accumulate import Accumulator
    from harnessrl.proxy.wire.boundary import decode_json
    from harnessrl.types import Sampling

    dialect = next(d for d in ALL if d.name == DIALECTS[dialect_name])
    raw = json.dumps(request(dialect_name, False, 1)[1]).encode()
    model = "bench-model" if dialect_name == "gemini" else None  # Gemini's is in its path
    parsed = dialect.parse_request(decode_json(raw), model=model, stream=False)
    policy = Sampling(temperature=1.0)
    used = parsed.sampling.override(policy, frozenset())
    answer = vllm_answer()
    acc = Accumulator()  # the reply as the proxy assembles it, for the turn's row
    for event in _events_from_completion(answer):
        acc.feed(event)
    return {"dialect": dialect, "raw": raw, "model": model, "parsed": parsed,
            "policy": policy, "used": used, "answer": answer, "acc": acc,
            "engine_request": msgspec.structs.replace(parsed, model="bench-model",
                                                      sampling=used),
            "ctx": ReplyContext("id-1", 1, "bench-model")}


def stages(dialect_name: str, repeats: int) -> dict[str, float]:
    """µs per call of each stage of one non-streamed call in `dialect_name`."""
    from harnessrl.proxy.engines.vllm import VLLMEngine, _events_from_completion
    from harnessrl.proxy.wire.accumulate import Accumulator
    from harnessrl.proxy.wire.boundary import decode_json
    from harnessrl.proxy.wire.history import check_arguments, check_tool_results, restore_arguments
    from harnessrl.store.rows import turn_row
    from harnessrl.types import Timings, Turn

    c = _call(dialect_name)
    dialect, parsed, engine = c["dialect"], c["parsed"], VLLMEngine("http://127.0.0.1:9")
    decoded = decode_json(c["raw"])

    events = _events_from_completion(c["answer"])

    def reply() -> bytes:
        acc = Accumulator()
        for event in events:
            acc.feed(event)
        return dialect.render_completion(acc.completion(), c["ctx"])

    def history() -> None:
        check_tool_results(parsed)
        check_arguments(parsed, {})
        restore_arguments(parsed, {})

    turn = Turn(rollout="k", index=0, dialect=dialect.name, status="ok",
                timings=Timings(1.0, 2.0, 3.0), raw_request=c["raw"], raw_response=reply(),
                request=parsed, completion=c["acc"].completion(),
                requested_sampling=parsed.sampling, used_sampling=c["used"], engine="vllm",
                model=c["acc"].model, reply_id=c["ctx"].id)
    found = {name: _timed(fn, repeats) for name, fn in {
        "read the request's JSON (boundary.decode_json)": lambda: decode_json(c["raw"]),
        "parse it into a ChatRequest (the dialect's parse_request)":
            lambda: dialect.parse_request(decoded, model=c["model"], stream=False),
        "history checks (tool results, call arguments)": history,
        "sampling policy (Sampling.override)":
            lambda: parsed.sampling.override(c["policy"], frozenset()),
        "the engine's request body (VLLMEngine._payload)":
            lambda: engine._payload(c["engine_request"], stream=False),
        "the engine's answer decoded into events (4,000 prompt ids, 200 tokens)":
            lambda: _events_from_completion(c["answer"]),
        "the reply accumulated and rendered in the dialect": reply,
        PACKING: lambda: turn_row(turn),
    }.items()}
    found["the store's write, packing excluded (row encoded + writer thread's commit)"] = (
        asyncio.run(_commit_us(turn, repeats)) - found[PACKING])
    found["the whole call in-process (baseline)"] = asyncio.run(_whole_us(dialect_name,
                                                                          repeats))
    return found


async def _commit_us(turn: Any, repeats: int) -> float:
    """The store's CPU per turn: the row encoded on the caller's thread and the writer
    thread's commit, each awaited before the next (as at c=1)."""
    import msgspec

    from harnessrl.store.writer import TraceStore
    from harnessrl.types import Rollout

    with tempfile.TemporaryDirectory() as tmp:
        store = TraceStore(Path(tmp))
        await store.put_rollout(Rollout("k", 0.0))
        turns = [msgspec.structs.replace(turn, index=i) for i in range(repeats + 20)]
        for t in turns[:20]:
            await store.add_turn(t)
        tid = next(t for t in threading.enumerate() if t.name == "trace-writer").native_id

        def cpu_ns() -> int:
            return int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])

        before, encoding = cpu_ns(), 0.0
        for t in turns[20:]:
            # `add_turn` encodes the row on the caller's thread before the writer thread
            # commits it: that part timed apart, the same call `add_turn` makes.
            start = time.thread_time()
            store._recent.prepare(t)
            encoding += time.thread_time() - start
            await store.add_turn(t)
        spent = cpu_ns() - before + encoding * 1e9
        store.close()
    return spent / repeats / 1e3


async def _whole_us(dialect_name: str, repeats: int) -> float:
    """The whole non-streamed call through the app, as stream_path.py measures it."""
    import stream_path
    from stream_cpu import request

    async with stream_path.replayed_app() as (app, key):
        calls = []
        for n in range(repeats + 10):
            path, body = request(dialect_name, False, n)
            route, _, query = path.partition("?")
            calls.append((f"/r/{key}{route}", query.encode(), json.dumps(body).encode()))
        for call in calls[:10]:
            await stream_path.asgi_call(app.router, *call)
        t0 = time.process_time()  # the writer thread's CPU is this process's too
        for call in calls[10:]:
            await stream_path.asgi_call(app.router, *call)
        return (time.process_time() - t0) / repeats * 1e6


def measure(argv: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    args = parse_args(argv)
    return {name: stages(name, args.repeats) for name in args.dialects.split(",")}


def rows(argv: Sequence[str] | None = None) -> list[Row]:
    out = []
    for dialect, found in measure(argv).items():
        whole = found.pop("the whole call in-process (baseline)")
        listed = sum(found.values())
        for stage, us in found.items():
            out.append(Row(f"{dialect} non-streamed call: {stage}", f"{us:,.0f} µs",
                           f"{100 * us / whole:.0f}% of the whole call in-process, "
                           f"{whole:,.0f} µs"))
        out.append(Row(f"{dialect} non-streamed call: routing, ASGI and the event loop (the "
                       "rest)", f"{whole - listed:,.0f} µs",
                       f"{100 * (whole - listed) / whole:.0f}% of {whole:,.0f} µs"))
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dialects", default=",".join(DIALECTS))
    ap.add_argument("--repeats", type=int, default=300)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    print("\n".join(figure_table(rows(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
