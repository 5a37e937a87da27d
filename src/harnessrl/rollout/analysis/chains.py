"""Chains: a rollout's turns sorted into the conversations the model saw, never re-tokenized.

A turn *extends* a chain when its prompt ids start with the ids of the chain's last turn,
prompt and completion: the harness sent its history back exactly as the model saw and
produced it, plus new tokens (tool results, user text, template tokens). Training makes
one sequence of each chain (`harnessrl.train.rows.samples`); the viewer and the reports show
them.

Several chains can be open at once, because harnesses interleave side calls (titles,
summaries) with the main conversation; a turn extends whichever open chain it extends,
the longest when several do. A turn that extends none starts a new chain, and the
`ChainBreak` says why and where its prompt left the closest chain, since that position
is what a user debugging re-tokenization drift or compaction needs to see.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Literal

from harnessrl.types import (
    BreakReason,
    ChainBreak,
    ExcludedTurn,
    ExcludeReason,
    Rollout,
    Tokens,
    Turn,
)

if TYPE_CHECKING:
    from harnessrl.store.reader import TraceReader

# A prompt sharing less than this fraction of a chain's first prompt is a different
# conversation (a side call has its own system prompt or task), not an edited history.
SIDE_CALL_SHARE = 0.5

BREAK_REASONS: dict[BreakReason, str] = {
    "first": "the rollout's first trainable turn: there was no chain to extend",
    "rewound": "the prompt is a proper prefix of a chain's tokens: the harness went back "
               "to an earlier point (a retry or a regenerated reply)",
    "side_call": f"the prompt shares less than {SIDE_CALL_SHARE:.0%} of the first prompt of "
                 "every chain: another conversation, such as title generation",
    "history_rewritten": "the prompt shares the start of a chain but differs inside it: in an "
                         "earlier completion (re-tokenization drift, reasoning dropped) or in "
                         "earlier inserted tokens (context compacted, history edited)",
}
EXCLUDE_REASONS: dict[ExcludeReason, str] = {
    "failed": "the call failed (status failed)",
    "cancelled": "the client went away before the reply ended (status cancelled)",
    "flagged": "the capture is suspect (turn.flags, e.g. logprob_count_mismatch)",
    "no_tokens": "prompt ids, completion ids or one logprob per completion id are missing",
    "retried": "the client sent this call again (its retry count said so) and went on from "
               "the later attempt: the harness never acted on this reply",
}


@dataclass(frozen=True, slots=True)
class Chain:
    """Turns of one rollout, each extending the one before; `start` says why it began."""

    turns: tuple[Turn, ...]
    start: ChainBreak


@dataclass(frozen=True, slots=True)
class Linked:
    """A rollout's turns sorted into chains, and the turns left out of every chain."""

    chains: list[Chain]
    excluded: list[ExcludedTurn]


@dataclass(frozen=True, slots=True)
class _Divergence:
    shared: int  # length of the common prefix of the prompt and the chain's tokens
    prompt_len: int
    first_prompt_len: int


# Tried in order; the first rule that holds names the break.
_RULES: tuple[tuple[BreakReason, Callable[[_Divergence], bool]], ...] = (
    ("rewound", lambda d: d.shared == d.prompt_len),
    ("side_call", lambda d: d.shared < SIDE_CALL_SHARE * d.first_prompt_len),
    ("history_rewritten", lambda d: True),
)


# ------------------------------------------------------------------ tokens
# Flags that say how a turn's ids were made, not that they are doubtful: token mode could
# not reuse the earlier ids and tokenized the prompt whole, or says why the prompt does not
# extend the last turn (`render_break:<reason>`); the ids are still the exact ids sent,
# the chain just breaks there.
INFORMATIONAL_FLAGS = frozenset({"render_fallback"})
INFORMATIONAL_PREFIXES = ("render_break:",)


def tokens(turn: Turn) -> Tokens:
    """The turn's tokens; only call on trainable turns (see `exclusion`)."""
    assert turn.completion is not None
    return turn.completion.tokens


def retried(turns: Iterable[Turn]) -> dict[int, int]:
    """Each turn a client retried -> the turn that retried it (`Turn.retry_of`)."""
    return {t.retry_of: t.index for t in turns if t.retry_of is not None}


def exclusion(turn: Turn, retried_by: int | None = None) -> ExcludedTurn | None:
    """Why `turn` cannot be trained on, or None when it can; `retried_by`: the later turn
    that retried it, a reason before its own status (a failed attempt is failed too)."""
    if retried_by is not None:
        own = "" if turn.status == "ok" else f"; it {turn.status}" + (
            f": {turn.error}" if turn.error else "")
        return ExcludedTurn(turn.index, "retried", f"retried as turn {retried_by}{own}")
    if turn.status != "ok":
        return ExcludedTurn(turn.index, turn.status, turn.error)
    if flags := [f for f in turn.flags if f not in INFORMATIONAL_FLAGS
                 and not f.startswith(INFORMATIONAL_PREFIXES)]:
        return ExcludedTurn(turn.index, "flagged", ",".join(flags))
    t = turn.completion.tokens if turn.completion is not None else None
    if (t is None or t.prompt_ids is None or t.completion_ids is None or t.logprobs is None
            or len(t.logprobs) != len(t.completion_ids)):
        return ExcludedTurn(turn.index, "no_tokens")
    return None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix; slice comparisons run in C, so bisect over them."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def extends(prompt: tuple[int, ...], last: Tokens) -> bool:
    """Whether `prompt` starts with `last`'s prompt and completion ids."""
    p, c = last.prompt_ids or (), last.completion_ids or ()
    return (len(prompt) >= len(p) + len(c) and prompt[:len(p)] == p
            and prompt[len(p):len(p) + len(c)] == c)


def _shared(prompt: tuple[int, ...], last: Tokens) -> int:
    p, c = last.prompt_ids or (), last.completion_ids or ()
    shared = common_prefix(prompt, p)
    return shared + common_prefix(prompt[shared:], c) if shared == len(p) else shared


# ------------------------------------------------------------------ chains
def link(turns: Sequence[Turn], *, keep_retried: bool = False) -> Linked:
    """Sort one rollout's turns into chains (in turn order) and excluded turns.
    `keep_retried`: a turn its client retried is judged as any other (by default it is
    excluded, `retried`)."""
    if len({t.rollout for t in turns}) > 1:
        raise ValueError("link() takes the turns of one rollout")
    open_chains: list[list[Turn]] = []
    starts: list[ChainBreak] = []
    excluded: list[ExcludedTurn] = []
    again = {} if keep_retried else retried(turns)
    for turn in sorted(turns, key=attrgetter("index")):
        if (why := exclusion(turn, again.get(turn.index))) is not None:
            excluded.append(why)
            continue
        prompt = tokens(turn).prompt_ids or ()
        extended = [c for c in open_chains if extends(prompt, tokens(c[-1]))]
        if extended:  # several can hold when chains nest; the longest is the closest
            max(extended, key=lambda c: length(c[-1])).append(turn)
            continue
        starts.append(_break(turn, prompt, open_chains))
        open_chains.append([turn])
    chains = [Chain(tuple(c), s) for c, s in zip(open_chains, starts, strict=True)]
    return Linked(chains, excluded)


def chains(turns: Sequence[Turn]) -> list[Chain]:
    return link(turns).chains


def length(turn: Turn) -> int:
    """The ids a trainable turn holds: its prompt and completion."""
    t = tokens(turn)
    return len(t.prompt_ids or ()) + len(t.completion_ids or ())


def _break(turn: Turn, prompt: tuple[int, ...], open_chains: list[list[Turn]]) -> ChainBreak:
    if not open_chains:
        return ChainBreak("first", turn.index)
    # The last turn's tokens hold every earlier turn's, so they share the most.
    shared, chain = max(((_shared(prompt, tokens(c[-1])), c) for c in open_chains),
                        key=lambda pair: pair[0])
    divergence = _Divergence(shared, len(prompt), len(tokens(chain[0]).prompt_ids or ()))
    reason: BreakReason = next(name for name, holds in _RULES if holds(divergence))
    within_turn, within = _locate(chain, shared)
    return ChainBreak(reason, turn.index, against=chain[-1].index, diverged_at=shared,
                      within=within, within_turn=within_turn)


def _locate(chain: list[Turn], position: int) -> tuple[int, Literal["prompt", "completion"]]:
    """The turn whose inserted prompt tokens or completion hold `position`."""
    for turn in chain:
        t = tokens(turn)
        if position < len(t.prompt_ids or ()):
            return turn.index, "prompt"
        if position < length(turn):
            return turn.index, "completion"
    return chain[-1].index, "completion"  # not reached: a break lies inside the chain


# ------------------------------------------------------------------ dropped replies
# The end of a reply looked for in the prompt that left it (its final id, the end of turn,
# may be rendered differently in history and is left out).
REPLY_TAIL = 16
# The most ids a chat template's generation header takes at a prompt's end (ChatML's
# `<|im_start|>assistant\n` is 3, Llama 3's 4; a template that opens an empty think
# block after it takes more).
GENERATION_HEADER = 12


def dropped_replies(linked: Linked) -> set[int]:
    """Turns whose reply the harness left out of its history: a later prompt reproduced
    the turn's prompt, then went on without the reply (a retry, or a reply it could not
    parse and threw away). A history that re-renders the reply (reasoning removed,
    re-tokenized) still holds the reply's end after the divergence; a dropped one does
    not. A prompt that goes on with another message where the reply was diverges inside
    the turn's generation header (`<|im_start|>assistant` becomes `<|im_start|>user`), so
    a divergence in the last GENERATION_HEADER ids of its prompt counts too, when no later
    turn went on from the reply. A rollout's last reply, which no later prompt could
    hold, is not dropped."""
    by_index = {t.index: t for c in linked.chains for t in c.turns}
    continued = {t.index for c in linked.chains for t in c.turns[:-1]}
    dropped: set[int] = set()
    for chain in linked.chains:
        start = chain.start
        if (start.against is None or start.diverged_at is None
                or start.within_turn != start.against or start.against in continued):
            continue
        against = tokens(by_index[start.against])
        in_header = (start.within == "prompt" and start.diverged_at
                     >= len(against.prompt_ids or ()) - GENERATION_HEADER)
        if start.within != "completion" and not in_header:
            continue
        reply = against.completion_ids or ()
        later = tokens(by_index[start.turn]).prompt_ids or ()
        tail = reply[-REPLY_TAIL - 1:-1] or reply
        if tail and not _holds(later[start.diverged_at:], tail):
            dropped.add(start.against)
    return dropped


def _holds(hay: Sequence[int], needle: Sequence[int]) -> bool:
    def text(ids: Sequence[int]) -> str:
        return "," + ",".join(map(str, ids)) + ","
    return text(needle) in text(hay)


# ------------------------------------------------------------------ statistics
@dataclass(slots=True)
class ChainStats:
    """Counts for one rollout or many.

    `extension_rate` = extended / (extended + history_rewritten): of the trainable turns
    that continued one of the rollout's conversations, the share whose prompt carried
    that conversation's tokens unchanged. A rollout's first turn, side calls and rewound
    turns (retries) continue nothing, and excluded turns are not trainable, so they are
    left out of both sides. None when no turn continued a conversation. `capped` counts
    the rollouts the proxy stopped at their step cap (a call refused as `step_cap`).
    """

    rollouts: int = 0
    turns: int = 0
    trainable: int = 0
    chains: int = 0
    breaks: Counter[str] = field(default_factory=Counter)
    excluded: Counter[str] = field(default_factory=Counter)
    capped: int = 0

    @property
    def extended(self) -> int:
        return self.trainable - self.chains

    @property
    def extension_rate(self) -> float | None:
        continuing = self.extended + self.breaks["history_rewritten"]
        return self.extended / continuing if continuing else None

    def add(self, other: ChainStats) -> None:
        self.rollouts += other.rollouts
        self.turns += other.turns
        self.trainable += other.trainable
        self.chains += other.chains
        self.breaks.update(other.breaks)
        self.excluded.update(other.excluded)
        self.capped += other.capped

    def to_dict(self) -> dict[str, Any]:
        return {"rollouts": self.rollouts, "turns": self.turns, "trainable": self.trainable,
                "chains": self.chains, "extended": self.extended,
                "extension_rate": self.extension_rate, "breaks": dict(self.breaks),
                "excluded": dict(self.excluded), "capped": self.capped}


def rollout_stats(turns: Sequence[Turn]) -> ChainStats:
    linked = link(turns)
    return ChainStats(
        rollouts=1, turns=len(turns), trainable=sum(len(c.turns) for c in linked.chains),
        chains=len(linked.chains), breaks=Counter(c.start.reason for c in linked.chains),
        excluded=Counter(e.reason for e in linked.excluded),
        capped=int(any(t.error_kind == "step_cap" for t in turns)))


def harness_of(rollout: Rollout | None) -> str:
    value = None if rollout is None else rollout.metadata.get("harness")
    return "unknown" if value is None else str(value)


@dataclass(slots=True)
class Report:
    rollouts: dict[str, tuple[str, ChainStats]] = field(default_factory=dict)  # key: harness
    harnesses: dict[str, ChainStats] = field(default_factory=dict)

    def add(self, key: str, harness: str, stats: ChainStats) -> None:
        self.rollouts[key] = (harness, stats)
        self.harnesses.setdefault(harness, ChainStats()).add(stats)

    def to_dict(self) -> dict[str, Any]:
        return {"harnesses": {h: s.to_dict() for h, s in self.harnesses.items()},
                "rollouts": {k: {"harness": h, **s.to_dict()}
                             for k, (h, s) in self.rollouts.items()}}


def build_report(traces: Iterable[tuple[Rollout | None, Sequence[Turn]]]) -> Report:
    report = Report()
    for rollout, turns in traces:
        key = rollout.key if rollout is not None else turns[0].rollout
        report.add(key, harness_of(rollout), rollout_stats(turns))
    return report


def report(store: TraceReader) -> Report:
    """Chain statistics of every rollout in the store, turns streamed one rollout at a time."""
    meta = {r.key: r for r in store.iter_rollouts()}
    grouped = ((key, list(turns)) for key, turns in
               groupby(store.iter_turns(bodies=False), key=attrgetter("rollout")))
    result = build_report((meta.pop(key, None), turns) for key, turns in grouped)
    for rollout in meta.values():  # rollouts that made no call
        result.add(rollout.key, harness_of(rollout), ChainStats(rollouts=1))
    return result
