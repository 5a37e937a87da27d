#!/usr/bin/env python3
"""The trace store's size and commit cost: schema v4's layout (every turn whole) against
v5's (what is new against an earlier turn, proxy/layout.py), in one run.

Both layouts are written by the same `TraceStore` into the same schema: the old one
through a subclass that packs each turn as v4 did (`rows.turn_row`, layout NULL), which is
exactly what a v4 file holds and how a v4 row is read. Sections:

  issue     the issue's case: 40 chat turns, history growing 4,000 characters a turn,
            token ids = the text's bytes: trace.db against the rollout's non-redundant
            content (each new piece once in each form the store keeps: raw request and
            response bytes, canonical messages, ids at 4 bytes, logprobs at 8)
  context   a rollout growing turn by turn to 64k tokens of real tokenizer text (this
            repository's sources as tool output, the tiny model's tokenizer): bytes and
            CPU per turn at 4k, 16k and 64k-token contexts, of the commit (what runs
            under the store's write lock) and of encoding the row before it (`add_turn`
            does both), each turn's ids and request fresh objects as an engine's answer
            and a client's request decode them; v5 twice: the row encoded in the commit
            (as first landed) and before it
  store     a store of many rollouts shaped like the reference's (17-40 turns, contexts
            to ~32k tokens, synthetic ids): file size, write rate, samples built per
            second, a viewer page's latency

    .venv/bin/python bench/store.py [--store-turns 20000] [--old-store-turns 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
from table import Row, figure_table, verdict

from harnessrl.proxy.layout import Prepared, Staged
from harnessrl.proxy.rows import INSERT_TURN, turn_row
from harnessrl.proxy.store import TraceStore
from harnessrl.train.samples import iter_samples
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
from harnessrl.ui.queries import RunReader

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = Path("~/.cache/harnessrl/models/tiny-qwen2").expanduser()
_encode = msgspec.json.Encoder().encode


class OldLayout(TraceStore):
    """The same store writing every turn whole, as schema v4 did."""

    def _params(self, db: sqlite3.Connection, staged: Staged,
                params: tuple[Any, ...] | Turn | Prepared) -> tuple[Any, ...]:
        if isinstance(params, Prepared):
            params = params.turn
        if isinstance(params, Turn):
            params = (*turn_row(params), None, None, None, None, None)
        self._note_written(params)
        return params


LAYOUTS: dict[str, type[TraceStore]] = {"v4 (whole)": OldLayout, "v5 (delta)": TraceStore}
# The context section's writers: the store class, and whether a turn's row is
# encoded before the commit (`add_turn` today) or in it (v5 as first landed).
WRITERS: dict[str, tuple[type[TraceStore], bool]] = {
    "v4 (whole)": (OldLayout, False),
    "v5, row encoded in the commit (before)": (TraceStore, False),
    "v5, row encoded before the commit (now)": (TraceStore, True),
}
_REQUEST = msgspec.json.Decoder(ChatRequest)
_IDS = msgspec.json.Decoder(tuple[int, ...])


# ------------------------------------------------------------------ turns
def chat_turn(key: str, index: int, messages: tuple[Message, ...], prompt: tuple[int, ...],
              reply_text: str, reply: tuple[int, ...]) -> Turn:
    raw = _encode({"model": "m", "messages": [{"role": m.role, "content": m.parts[0].text}  # type: ignore[union-attr]
                                              for m in messages], "temperature": 1.0})
    response = _encode({"id": f"chatcmpl-{index}", "choices": [{"message": {
        "role": "assistant", "content": reply_text}, "finish_reason": "stop"}]})
    logprobs = tuple(-0.001 * (1 + (i * 7919) % 5000) for i in range(len(reply)))
    return Turn(key, index, "openai_chat", "ok", Timings(time.time(), None, time.time()), raw,
                response, ChatRequest("m", messages),
                Completion("m", (Text(reply_text),), "stop", Usage(len(prompt), len(reply)),
                           Tokens(prompt, reply, logprobs)),
                engine="bench", model="m", reply_id=f"chatcmpl-{key}-{index}")


def conversation(key: str, turns: int, new_text: Iterator[str], reply_text: Iterator[str],
                 tokenize: Any) -> Iterator[tuple[Turn, int]]:
    """A rollout whose history grows each turn by a user message and the reply; yields
    each turn and the non-redundant bytes it adds."""
    messages: tuple[Message, ...] = ()
    prompt: tuple[int, ...] = ()
    for index in range(turns):
        text, answer = next(new_text), next(reply_text)
        new_ids = tuple(tokenize(text))
        messages += (Message("user", (Text(text),)),)
        prompt += new_ids
        reply = tuple(tokenize(answer))
        turn = chat_turn(key, index, messages, prompt, answer, reply)
        assert turn.completion is not None
        reply_json = _encode(msgspec.structs.replace(turn.completion,
                                                     tokens=Tokens(None, None, None)))
        # Each new piece once per form: the message text in the raw request and in the
        # canonical messages (the reply too, as the next request's history), the new
        # prompt ids, the reply's ids and logprobs, the raw response and the reply's JSON.
        new = (2 * (len(_encode(text)) + len(_encode(answer))) + 4 * len(new_ids)
               + 12 * len(reply) + len(turn.raw_response) + len(reply_json))
        yield turn, new
        messages += (Message("assistant", (Text(answer),)),)
        prompt += reply


def repo_text() -> Iterator[str]:
    """This repository's sources, over and over: real text as a tool would print it."""
    files = sorted((ROOT / "src").rglob("*.py")) + sorted((ROOT / "docs").rglob("*.md"))
    while True:
        for path in files:
            yield path.read_text()


def chunks(size: int) -> Iterator[str]:
    buffer = ""
    for text in repo_text():
        buffer += text
        while len(buffer) >= size:
            yield buffer[:size]
            buffer = buffer[size:]


def write_timed(store: TraceStore, turn: Turn, early: bool) -> tuple[float, float]:
    """CPU seconds (this thread) of encoding the row before the commit (0 if not
    `early`: encoded in the commit) and of the commit, as `add_turn(alone=True)` does."""
    start = time.thread_time()
    write: Turn | Prepared = store._recent.prepare(turn) if early else turn
    prepared = time.thread_time()
    assert store._commit_here((INSERT_TURN, write))  # the commit alone, on this thread
    return prepared - start, time.thread_time() - prepared


def fresh(turn: Turn) -> Turn:
    """`turn` with its ids and request decoded anew, as a proxy has them: each call's
    ids are new int objects (a compare with an earlier turn's cannot short-cut on
    identity) and its messages new strings."""
    assert turn.completion is not None
    tokens = turn.completion.tokens
    prompt, sampled = (None if v is None else _IDS.decode(_encode(v))
                       for v in (tokens.prompt_ids, tokens.completion_ids))
    ids = Tokens(prompt, sampled, tokens.logprobs)
    return msgspec.structs.replace(
        turn, request=_REQUEST.decode(_encode(turn.request)),
        completion=msgspec.structs.replace(turn.completion, tokens=ids))


def db_bytes(run_dir: Path) -> int:
    return sum(p.stat().st_size for p in run_dir.glob("trace.db*") if p.name != "trace.db-writer")


# ------------------------------------------------------------------ the issue's rollout
def issue_rows(tmp: Path) -> list[Row]:
    sizes, content = {}, 0
    for name, kind in LAYOUTS.items():
        run_dir = tmp / f"issue-{kind.__name__}"
        content = 0
        with kind(run_dir) as store:
            for turn, new in conversation("k", 40, chunks(4000), chunks(400),
                                          lambda s: tuple(s.encode())):
                write_timed(store, turn, early=True)
                content += new
        sizes[name] = db_bytes(run_dir)
    old, new = sizes["v4 (whole)"], sizes["v5 (delta)"]
    return [Row("40-turn chat rollout (history +4,000 chars/turn, ids = text bytes): trace.db",
                f"v5 {new / 1e6:.2f} MB ({new / content:.2f}x content); "
                f"v4 {old / 1e6:.2f} MB ({old / content:.1f}x)",
                f"non-redundant content {content / 1e6:.2f} MB", "v5 <= 1.5x content",
                verdict(new <= 1.5 * content))]


# ------------------------------------------------------------------ a growing context
def context_rows(tmp: Path, repeats: int) -> list[Row]:
    from transformers import AutoTokenizer

    if not TOKENIZER.exists():
        from harnessrl.models.tiny import build_tiny_model
        build_tiny_model(TOKENIZER)
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)

    def tokenize(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    # One rollout to 64k+ tokens, ~1,000 new tokens a turn; built once, written per layout.
    turns: list[Turn] = []
    for turn, _new in conversation("k", 200, chunks(3000), chunks(600), tokenize):
        turns.append(fresh(turn))
        assert turn.completion is not None and turn.completion.tokens.prompt_ids is not None
        if len(turn.completion.tokens.prompt_ids) > 66_000:
            break
    contexts = [len(t.completion.tokens.prompt_ids) for t in turns  # type: ignore[union-attr, arg-type]
                ]
    # cpu[name][run][turn] = (encoding the row before the commit, the commit)
    cpu: dict[str, list[list[tuple[float, float]]]] = {name: [] for name in WRITERS}
    size: dict[str, list[int]] = {}
    for r in range(repeats):
        for name, (kind, early) in WRITERS.items():
            run_dir = tmp / f"context-{r}-{len(cpu[name])}-{kind.__name__}-{early}"
            with kind(run_dir) as store:
                cpu[name].append([write_timed(store, turn, early) for turn in turns])
                size[name] = [len(row[0] or b"") + len(row[1] or b"") + len(row[2] or b"")
                              for row in store.db.execute(
                                  "SELECT raw_request, request, prompt_ids FROM turns"
                                  " ORDER BY idx")]
    rows = []
    per: dict[str, dict[int, tuple[float, float]]] = {}
    for name in WRITERS:
        per[name] = {}
        for target in (4_000, 16_000, 64_000):
            # The three turns whose context is closest to the target.
            near = sorted(range(len(contexts)), key=lambda i: abs(contexts[i] - target))[:3]
            found, committed = (statistics.median(
                cpu[name][r][i][part] for r in range(repeats) for i in near) * 1e6
                for part in (0, 1))
            stored = statistics.median(size[name][i] for i in near)
            per[name][target] = (found, committed)
            rows.append(Row(f"{name}: CPU per turn at ~{target // 1000}k tokens of context,"
                            " encoding the row before the commit + the commit; stored bytes"
                            " (raw request + request + prompt ids)",
                            f"{found:.0f} + {committed:.0f} µs, {stored / 1024:.1f} KiB",
                            f"{len(near)} turns x {repeats} runs"))
    return rows + _context_ratios(per)


def _context_ratios(per: dict[str, dict[int, tuple[float, float]]]) -> list[Row]:
    def ratio(name: str, part: slice) -> float:
        return sum(per[name][64_000][part]) / sum(per[name][4_000][part])

    old, before, now = WRITERS
    commit, whole = slice(1, 2), slice(0, 2)
    return [
        Row("v5 commit CPU per turn (what runs under the write lock), 64k vs 4k context",
            f"{ratio(now, commit):.2f}x", f"the row encoded in the commit: "
            f"{ratio(before, commit):.2f}x; v4: {ratio(old, commit):.2f}x", "<= 1.2x",
            verdict(ratio(now, commit) <= 1.2)),
        Row("v5 CPU per turn of the whole write (row encoded + commit), 64k vs 4k context",
            f"{ratio(now, whole):.2f}x", f"the row encoded in the commit: "
            f"{ratio(before, whole):.2f}x; at 64k now/v4 "
            f"{sum(per[now][64_000]) / sum(per[old][64_000]):.2f}",
            "(the issue's 1.2x, applied to the whole write)",
            verdict(ratio(now, whole) <= 1.2)),
    ]


# ------------------------------------------------------------------ a store of many turns
def shaped_rollout(key: str, rng: random.Random) -> Iterator[Turn]:
    """17-40 turns; a 600-token system prompt, 200-1,200 new tokens a turn (tool output),
    replies of 50-400 tokens; contexts up to ~32k tokens."""
    turns = rng.randint(17, 40)
    prompt = tuple(rng.randrange(150_000) for _ in range(600))
    messages: tuple[Message, ...] = (Message("system", (Text("You are an agent. " * 60),)),)
    for index in range(turns):
        new = rng.randint(200, 1_200)
        prompt += tuple(rng.randrange(150_000) for _ in range(new))
        messages += (Message("user", (Text(f"output {index}: " + "ab cd " * new),)),)
        reply_n = rng.randint(50, 400)
        reply = tuple(rng.randrange(150_000) for _ in range(reply_n))
        text = "thinking and calling a tool " * (reply_n // 6)
        yield chat_turn(key, index, messages, prompt, text, reply)
        messages += (Message("assistant", (Text(text),)),)
        prompt += reply


async def fill(store: TraceStore, turns: int, seed: int, open_rollouts: int = 32) -> int:
    """Rollouts written as a proxy does: `open_rollouts` at a time, one turn each in turn,
    committed in groups."""
    rng, made, n = random.Random(seed), 0, 0
    live: list[Iterator[Turn]] = []
    while made < turns:
        while len(live) < open_rollouts:
            key = f"r{n:07d}"
            n += 1
            await store.put_rollout(Rollout(key, time.time(), metadata={"task": f"t{n % 50}"}))
            live.append(shaped_rollout(key, rng))
        batch = []
        for it in list(live):
            turn = next(it, None)
            if turn is None:
                live.remove(it)
            else:
                batch.append(turn)
        await asyncio.gather(*(store.add_turn(t) for t in batch))
        made += len(batch)
    return made


def store_rows(tmp: Path, turns: dict[str, int]) -> list[Row]:
    rows, figures = [], {}
    for name, kind in LAYOUTS.items():
        run_dir = tmp / f"store-{kind.__name__}"
        with kind(run_dir) as store:
            start, cpu = time.perf_counter(), time.process_time()
            made = asyncio.run(fill(store, turns[name], seed=1))
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            keys = [r[0] for r in store.db.execute("SELECT DISTINCT rollout FROM turns"
                                                   " ORDER BY rollout")]
        size = db_bytes(run_dir)
        with TraceStore(run_dir) as store:
            start = time.perf_counter()
            built = [len(sample.turns) for sample in iter_samples(store)]
            took = time.perf_counter() - start
            sample_rate, turn_rate = len(built) / took, sum(built) / took
        page, chain = _viewer(run_dir, keys[:50])
        figures[name] = (sample_rate, page)
        rows.append(Row(f"{name}: store of {made:,} turns ({len(keys):,} rollouts of 17-40)",
                        f"{size / 1e9:.2f} GB ({size / made / 1024:.1f} KiB/turn); "
                        f"{made / wall:,.0f} turns/s written "
                        f"({cpu / made * 1e3:.2f} ms CPU/turn); {sample_rate:,.0f} samples/s "
                        f"({turn_rate:,.0f} turns/s); viewer page (turns 20-39) "
                        f"{page:.1f} ms, token view {chain:.1f} ms"))
    (new_rate, new_page), (old_rate, old_page) = figures["v5 (delta)"], figures["v4 (whole)"]
    rows.append(Row("v5 samples/s and viewer page vs v4", f"samples {new_rate / old_rate:.2f}x,"
                    f" page latency {new_page / old_page:.2f}x", "v4, same shapes",
                    "samples >= 1x, page <= 1x",
                    verdict(new_rate >= 0.95 * old_rate and new_page <= 1.05 * old_page)))
    return rows


def _viewer(run_dir: Path, keys: list[str]) -> tuple[float, float]:
    """Median ms of a rollout page's turns (20-39, bodies and all) and of its token view
    (every turn's ids), each rollout read fresh (the token view's cache cleared)."""
    reader = RunReader(run_dir)
    try:
        page = _median_ms(lambda k: reader.turns(k, 20, 20), keys)
        tokens = _median_ms(lambda k: (reader._token_cache.clear(), reader.token_turns(k)),
                            keys)
    finally:
        reader.close()
    return page, tokens


def _median_ms(read: Any, keys: list[str]) -> float:
    for k in keys[:3]:  # warm the page cache
        read(k)
    times = []
    for k in keys:
        start = time.perf_counter()
        read(k)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def rows(argv: list[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--store-turns", type=int, default=20_000)
    ap.add_argument("--old-store-turns", type=int, default=0,
                    help="turns in the v4 store (default: as many as the v5 one)")
    ap.add_argument("--only", default="issue,context,store")
    args = ap.parse_args(argv)
    wanted = set(args.only.split(","))
    out: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="store-bench-") as tmp:
        if "issue" in wanted:
            out += issue_rows(Path(tmp))
        if "context" in wanted:
            out += context_rows(Path(tmp), args.repeats)
        if "store" in wanted:
            out += store_rows(Path(tmp), {"v5 (delta)": args.store_turns,
                                          "v4 (whole)": args.old_store_turns or args.store_turns})
    return out


def main(argv: list[str] | None = None) -> int:
    print("\n".join(figure_table(rows(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
