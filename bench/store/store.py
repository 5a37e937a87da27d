#!/usr/bin/env python3
"""The trace store's size and commit cost: schema v4's layout (every turn whole), v5's
previous layout (a prompt stored against an earlier turn only when it extends it exactly)
and v5's current one (against the recent turn sharing the longest prefix,
store/layout.py), in one run.

The three are written by the same `TraceStore` into the same schema: v4 through a
subclass that packs each turn as v4 did (`rows.turn_row`, layout NULL), which is exactly
what a v4 file holds and how a v4 row is read; v5's previous layout by swapping in the
parent rule it had (`_exact_parent`, verbatim from main at 5e3d0e0; the rest of the row,
bodies included, is encoded the same). Sections:

  issue     the issue's case: 40 chat turns, history growing 4,000 characters a turn,
            token ids = the text's bytes, in two shapes: each prompt extends the last, and
            a rewritten history (each prompt ends with a reminder the next one no longer
            has: a long shared prefix, never an extension): trace.db against the
            rollout's non-redundant content (each new piece once in each form the store
            keeps: raw request and response bytes, canonical messages, ids at 4 bytes,
            logprobs at 8)
  context   a rollout growing turn by turn to 64k tokens of real tokenizer text (this
            repository's sources as tool output, the tiny model's tokenizer), in both
            shapes: bytes and CPU per turn at 4k, 16k and 64k-token contexts, of encoding
            the row before the commit and of the commit (`add_turn` does both), each
            turn's ids and request fresh objects as an engine's answer and a client's
            request decode them
  store     a store of many rollouts shaped like the reference's (17-40 turns, contexts
            to ~32k tokens, synthetic ids): file size, write rate, samples built per
            second, a viewer page's latency

    .venv/bin/python bench/store/store.py [--store-turns 20000] [--old-store-turns 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

from harnessrl.store import layout
from harnessrl.store.layout import Prepared, Staged
from harnessrl.store.reader import TraceReader
from harnessrl.store.rows import INSERT_TURN, turn_row
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
from harnessrl.ui.queries import RunReader

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "common")]  # bench/ is not a package

from table import Row, figure_table, verdict  # noqa: E402

ROOT = HERE.parents[1]
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


def _exact_extends(prompt: tuple[int, ...], turn: Turn) -> int | None:
    """The previous layout's rule (main at 5e3d0e0, `layout._extends`), verbatim."""
    tokens = turn.completion.tokens if turn.completion is not None else None
    if tokens is None or tokens.prompt_ids is None:
        return None
    before, sampled = tokens.prompt_ids, tokens.completion_ids or ()
    n = len(before)
    if n == 0 or len(prompt) < n or prompt[n - 1] != before[-1] or prompt[0] != before[0]:
        return None
    if prompt[:n] != before:
        return None
    keep = n + len(sampled)
    if sampled and len(prompt) >= keep and prompt[n:keep] == sampled:
        return keep
    return n


def _exact_parent(prompt: tuple[int, ...], turn: Turn, recent: Any) -> tuple[Turn, int] | None:
    for earlier in reversed(recent):  # the latest first: the likeliest parent
        if earlier.index < turn.index and (keep := _exact_extends(prompt, earlier)) is not None:
            return earlier, keep
    return None


@contextlib.contextmanager
def parent_rule(exact: bool) -> Iterator[None]:
    """v5's previous parent rule (`exact`) or the current one, while the block runs."""
    real = layout._parent
    layout._parent = _exact_parent if exact else real  # type: ignore[assignment]
    try:
        yield
    finally:
        layout._parent = real  # type: ignore[assignment]


# Each layout: its store class and whether v5's previous parent rule is swapped in.
LAYOUTS: dict[str, tuple[type[TraceStore], bool]] = {
    "v4 (whole)": (OldLayout, False),
    "v5, exact extension only (before)": (TraceStore, True),
    "v5, longest shared prefix (now)": (TraceStore, False),
}
OLD, BEFORE, NOW = LAYOUTS
SHAPES = {"extends": False, "rewritten": True}
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
                 tokenize: Any, rewrite: bool = False) -> Iterator[tuple[Turn, int]]:
    """A rollout whose history grows each turn by a user message and the reply; yields
    each turn and the non-redundant bytes it adds. `rewrite`: each request ends with a
    reminder message (and its prompt with the reminder's ids) that the next request no
    longer has, as harnesses that edit system reminders send: each prompt shares all but
    its reminder with the last and extends none."""
    messages: tuple[Message, ...] = ()
    prompt: tuple[int, ...] = ()
    for index in range(turns):
        text, answer = next(new_text), next(reply_text)
        new_ids = tuple(tokenize(text))
        messages += (Message("user", (Text(text),)),)
        prompt += new_ids
        note = (f"<system-reminder>turn {index}: {index % 7} files changed, "
                f"{40 - index} calls left, todo list {'done ' * (index % 5)}</system-reminder>")
        tail = (Message("user", (Text(note),)),) if rewrite else ()
        note_ids = tuple(tokenize(note)) if rewrite else ()
        reply = tuple(tokenize(answer))
        turn = chat_turn(key, index, messages + tail, prompt + note_ids, answer, reply)
        assert turn.completion is not None
        reply_json = _encode(msgspec.structs.replace(turn.completion,
                                                     tokens=Tokens(None, None, None)))
        # Each new piece once per form: the message text in the raw request and in the
        # canonical messages (the reply too, as the next request's history), the new
        # prompt ids, the reply's ids and logprobs, the raw response and the reply's JSON;
        # a reminder is new content in its turn (text twice, ids once).
        new = (2 * (len(_encode(text)) + len(_encode(answer))) + 4 * len(new_ids)
               + 12 * len(reply) + len(turn.raw_response) + len(reply_json))
        new += 2 * len(_encode(note)) + 4 * len(note_ids) if rewrite else 0
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
    rows = []
    for shape, rewrite in SHAPES.items():
        sizes, content = {}, 0
        for name, (kind, exact) in LAYOUTS.items():
            run_dir = tmp / f"issue-{shape}-{kind.__name__}-{exact}"
            content = 0
            with parent_rule(exact), kind(run_dir) as store:
                for turn, new in conversation("k", 40, chunks(4000), chunks(400),
                                              lambda s: tuple(s.encode()), rewrite):
                    write_timed(store, turn, early=True)
                    content += new
                parents = store.db.execute(
                    "SELECT COUNT(prompt_parent) FROM turns").fetchone()[0]
            sizes[name] = (db_bytes(run_dir), parents)
        (now, with_parent), (before, before_parents), (old, _) = (
            sizes[NOW], sizes[BEFORE], sizes[OLD])
        rows.append(Row(
            f"40-turn chat rollout, {shape} (history +4,000 chars/turn, ids = text bytes):"
            " trace.db", f"now {now / 1e6:.2f} MB ({now / content:.2f}x content, "
            f"{with_parent}/40 with a parent); before {before / 1e6:.2f} MB "
            f"({before / content:.2f}x, {before_parents}/40); v4 {old / 1e6:.2f} MB "
            f"({old / content:.1f}x)", f"non-redundant content {content / 1e6:.2f} MB",
            "now <= 1.5x content", verdict(now <= 1.5 * content)))
    return rows


# ------------------------------------------------------------------ a real run's store
def real_rows(tmp: Path, source: Path) -> list[Row]:
    """A real run's turns (`source`, a run directory or its trace.db) written again in
    each layout, rollout by rollout in order: the share of turns stored with a parent
    and the file's size."""
    run = source if source.is_dir() else source.parent
    with TraceReader(run, up_to_date=True) as reader:
        turns = list(reader.iter_turns())
    cells = []
    for name, (kind, exact) in LAYOUTS.items():
        run_dir = tmp / f"real-{kind.__name__}-{exact}"
        with parent_rule(exact), kind(run_dir) as store:
            for turn in turns:
                write_timed(store, turn, early=True)
            parents = store.db.execute("SELECT COUNT(prompt_parent) FROM turns").fetchone()[0]
        cells.append(f"{name}: {parents}/{len(turns)} with a parent, "
                     f"{db_bytes(run_dir) / 1e6:.2f} MB")
    return [Row(f"a real run's store ({run.name}, {len(turns)} turns) written again",
                "; ".join(cells), str(source))]


# ------------------------------------------------------------------ a growing context
def context_rows(tmp: Path, repeats: int) -> list[Row]:
    from transformers import AutoTokenizer

    if not TOKENIZER.exists():
        from harnessrl.models.tiny import build_tiny_model
        build_tiny_model(TOKENIZER)
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)

    def tokenize(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    rows: list[Row] = []
    for shape, rewrite in SHAPES.items():
        rows += _context_shape(tmp, repeats, shape, _grown(tokenize, rewrite))
    return rows


def _grown(tokenize: Any, rewrite: bool) -> list[Turn]:
    """One rollout to 64k+ tokens, ~1,000 new tokens a turn; built once, written per layout."""
    turns: list[Turn] = []
    for turn, _new in conversation("k", 200, chunks(3000), chunks(600), tokenize, rewrite):
        turns.append(fresh(turn))
        assert turn.completion is not None and turn.completion.tokens.prompt_ids is not None
        if len(turn.completion.tokens.prompt_ids) > 66_000:
            break
    return turns


def _context_shape(tmp: Path, repeats: int, shape: str, turns: list[Turn]) -> list[Row]:
    contexts = [len(t.completion.tokens.prompt_ids) for t in turns]  # type: ignore[union-attr, arg-type]
    # cpu[name][run][turn] = (encoding the row before the commit, the commit)
    cpu: dict[str, list[list[tuple[float, float]]]] = {name: [] for name in LAYOUTS}
    size: dict[str, list[int]] = {}
    for r in range(repeats):
        for name, (kind, exact) in LAYOUTS.items():
            run_dir = tmp / f"context-{shape}-{r}-{len(cpu[name])}-{kind.__name__}-{exact}"
            with parent_rule(exact), kind(run_dir) as store:
                cpu[name].append([write_timed(store, turn, True) for turn in turns])
                size[name] = [len(row[0] or b"") + len(row[1] or b"") + len(row[2] or b"")
                              for row in store.db.execute(
                                  "SELECT raw_request, request, prompt_ids FROM turns"
                                  " ORDER BY idx")]
    rows = []
    for name in LAYOUTS:
        cells = []
        for target in (4_000, 16_000, 64_000):
            # The three turns whose context is closest to the target.
            near = sorted(range(len(contexts)), key=lambda i: abs(contexts[i] - target))[:3]
            found, committed = (statistics.median(
                cpu[name][r][i][part] for r in range(repeats) for i in near) * 1e6
                for part in (0, 1))
            stored = statistics.median(size[name][i] for i in near)
            cells.append(f"{target // 1000}k: {found:.0f} + {committed:.0f} µs, "
                         f"{stored / 1024:.1f} KiB")
        rows.append(Row(f"{name}, {shape}: CPU per turn (encoding the row before the commit"
                        " + the commit) and stored bytes (raw request + request + prompt"
                        " ids) at ~4k / 16k / 64k tokens of context", "; ".join(cells),
                        f"3 turns x {repeats} runs each"))
    return rows


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
    for name in (OLD, NOW):
        kind = LAYOUTS[name][0]
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
    (new_rate, new_page), (old_rate, old_page) = figures[NOW], figures[OLD]
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
    ap.add_argument("--real", type=Path, action="append", default=[],
                    help="a real run's directory (or trace.db) to write again in each layout")
    args = ap.parse_args(argv)
    wanted = set(args.only.split(","))
    out: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="store-bench-") as tmp:
        if "issue" in wanted:
            out += issue_rows(Path(tmp))
        for source in args.real:
            out += real_rows(Path(tmp), source)
        if "context" in wanted:
            out += context_rows(Path(tmp), args.repeats)
        if "store" in wanted:
            out += store_rows(Path(tmp), {NOW: args.store_turns,
                                          OLD: args.old_store_turns or args.store_turns})
    return out


def main(argv: list[str] | None = None) -> int:
    print("\n".join(figure_table(rows(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
