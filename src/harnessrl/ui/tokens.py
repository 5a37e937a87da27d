"""The tokens page: one turn's sampled ids with their logprobs, the environment's inserted
ids apart from them, and the rollout's chains with the reason for every break.

Chains come from `harnessrl.rollout.analysis.chains.link`, the same code that builds training
samples, so what the page shows is what training gets. Ids are turned into text only with
a real tokenizer (the one given with `--tokenizer`, or the run's model when its name is a
local model directory); without one the page shows ids, never guessed text.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from harnessrl.rollout.analysis.chains import BREAK_REASONS, EXCLUDE_REASONS, Linked, link
from harnessrl.rollout.analysis.drift import CAUSES, Drift, drifts
from harnessrl.rollout.analysis.kinds import label
from harnessrl.types import Turn

WINDOW = 2000  # prompt / inserted ids sent per request; the page pages through the rest
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class Decoder:
    """Tokenizers by path, loaded once; `explicit` (from --tokenizer) wins over the run's."""

    def __init__(self, explicit: str | None = None) -> None:
        self.explicit = explicit
        self._loaded: dict[str, Any] = {}
        self._errors: dict[str, str] = {}
        self._lock = threading.Lock()

    def source(self, model: str | None) -> str | None:
        """Where a tokenizer for `model` comes from, or None if there is none."""
        if self.explicit:
            return self.explicit
        if model:
            path = Path(model).expanduser()
            if path.is_dir() and any((path / f).is_file() for f in _TOKENIZER_FILES):
                return str(path)
        return None

    def get(self, model: str | None) -> tuple[Any, str | None, str | None]:
        """(tokenizer or None, its source, why it could not be loaded)."""
        src = self.source(model)
        if src is None:
            return None, None, "no tokenizer: the run's model is not a local model directory;" \
                               " start the viewer with --tokenizer PATH to see text"
        with self._lock:
            if src not in self._loaded and src not in self._errors:
                try:
                    from transformers import AutoTokenizer

                    self._loaded[src] = AutoTokenizer.from_pretrained(src)
                except Exception as exc:  # any loader failure: show ids, say why
                    self._errors[src] = f"tokenizer {src} did not load: {exc}"
        return self._loaded.get(src), src, self._errors.get(src)

    @staticmethod
    def pieces(tokenizer: Any, ids: Sequence[int]) -> list[str] | None:
        """Each id's own text (a byte-level piece of a multi-byte character shows as the
        replacement character, as the tokenizer decodes it)."""
        if tokenizer is None:
            return None
        try:
            return [tokenizer.decode([i]) for i in ids]
        except Exception:  # an id outside the vocabulary: show ids only
            return None


def chain_map(linked: Linked, found: dict[int, Drift] | None = None,
              tokenizer: Any = None) -> dict[str, Any]:
    """The rollout's chains and excluded turns, each with its reason in words; with
    `found`, each break's drift cause and what lies on both sides of its difference."""
    found = found or {}
    return {
        "chains": [{"turns": [t.index for t in c.turns],
                    "start": msgspec.to_builtins(c.start),
                    "why": BREAK_REASONS[c.start.reason],
                    "drift": _drift(found.get(c.turns[0].index), tokenizer)}
                   for c in linked.chains],
        "excluded": [{**msgspec.to_builtins(e), "why": EXCLUDE_REASONS[e.reason]}
                     for e in linked.excluded],
    }


def _drift(drift: Drift | None, tokenizer: Any) -> dict[str, Any] | None:
    if drift is None:
        return None
    _, what, training = CAUSES[drift.cause]
    return {**msgspec.to_builtins(drift), "what": what, "training": training,
            "old_pieces": Decoder.pieces(tokenizer, drift.old_ids),
            "new_pieces": Decoder.pieces(tokenizer, drift.new_ids)}


def _ids(turn: Turn) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None,
                              tuple[float, ...] | None]:
    t = turn.completion.tokens if turn.completion is not None else None
    if t is None:
        return None, None, None
    return t.prompt_ids, t.completion_ids, t.logprobs


def _context(turns: Sequence[Turn], linked: Linked, index: int) -> dict[str, Any]:
    """What came before the turn's reply: the ids the environment inserted since the
    previous turn of its chain (masked in training), or, for a chain's first turn, its
    whole prompt."""
    turn = next(t for t in turns if t.index == index)
    prompt = _ids(turn)[0]
    for number, chain in enumerate(linked.chains):
        pos = next((i for i, t in enumerate(chain.turns) if t.index == index), None)
        if pos is None:
            continue
        if pos == 0:  # where its prompt left the closest chain, when it broke away
            return {"kind": "prompt", "chain": number, "from_turn": None, "start": 0,
                    "diverged_at": chain.start.diverged_at, "ids": prompt or ()}
        before = chain.turns[pos - 1]
        p, c, _ = _ids(before)
        start = len(p or ()) + len(c or ())
        return {"kind": "inserted", "chain": number, "from_turn": before.index,
                "start": start, "diverged_at": None, "ids": (prompt or ())[start:]}
    return {"kind": "prompt", "chain": None, "from_turn": None, "start": 0,
            "diverged_at": None, "ids": prompt or ()}


def token_view(turns: Sequence[Turn], index: int, decoder: Decoder, model: str | None,
               ctx_offset: int | None = None,
               messages: Callable[[], Sequence[Turn]] | None = None,
               harness: str | None = None) -> dict[str, Any] | None:
    """The tokens page for turn `index` of one rollout's `turns` (as read for linking).
    `messages` reads the turns with their requests, for the causes of chain breaks;
    `harness` names the rollout's harness, for its call-kind hints."""
    turn = next((t for t in turns if t.index == index), None)
    if turn is None:
        return None
    linked = link(turns)
    tokenizer, source, problem = decoder.get(model)
    prompt, completion, logprobs = _ids(turn)
    ctx = _context(turns, linked, index)
    ids = ctx.pop("ids")
    total = len(ids)
    if ctx_offset is None and ctx["diverged_at"] is not None:  # a break: show where
        ctx_offset = max(0, ctx["diverged_at"] - WINDOW // 4)
    elif ctx_offset is None:  # a long prompt: its end (the newest messages) matters most
        ctx_offset = max(0, total - WINDOW) if ctx["kind"] == "prompt" else 0
    ctx_offset = min(max(0, ctx_offset), max(0, total - 1))
    window = list(ids[ctx_offset:ctx_offset + WINDOW])
    return {
        "index": index, "status": turn.status, "flags": list(turn.flags),
        "tokenizer": source, "tokenizer_problem": None if tokenizer else problem,
        "prompt_len": None if prompt is None else len(prompt),
        "completion": {
            "ids": None if completion is None else list(completion),
            "logprobs": None if logprobs is None else list(logprobs),
            "text": Decoder.pieces(tokenizer, completion or ()) if completion else None,
        },
        "context": {**ctx, "total": total, "offset": ctx_offset, "ids": window,
                    "text": Decoder.pieces(tokenizer, window)},
        **chain_map(linked, _causes(linked, messages, harness), tokenizer),
    }


def _causes(linked: Linked, messages: Callable[[], Sequence[Turn]] | None,
            harness: str | None) -> dict[int, Drift]:
    if messages is None or all(c.start.reason == "first" for c in linked.chains):
        return {}
    chains = link(messages()).chains
    return {d.turn: d for d in drifts(chains, label(chains, harness))}
