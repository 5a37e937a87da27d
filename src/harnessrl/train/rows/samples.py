"""Samples: each chain of a rollout becomes one training sequence, never re-tokenized.

A chain (`harnessrl.rollout.analysis.chains`) is one `Sample`: the first prompt, then every turn's
sampled ids (mask 1, with the engine's logprobs) and the ids inserted between turns (mask
0, no logprob).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from itertools import groupby
from operator import attrgetter
from typing import TYPE_CHECKING

from harnessrl.rollout.analysis.chains import Chain, extends, length, link, tokens
from harnessrl.rollout.analysis.kinds import chain_kind, label
from harnessrl.types import CallKind, Sample, Turn

if TYPE_CHECKING:
    from harnessrl.store.reader import TraceReader


def _pieces(chain: Chain) -> Iterator[tuple[Turn, Sequence[int], Sequence[int]]]:
    """Each turn of the chain with its sampled ids and the ids inserted after them (the
    rest of the next turn's prompt); raises ValueError where a turn does not extend the
    one before."""
    for turn, after in zip(chain.turns, (*chain.turns[1:], None), strict=True):
        t = tokens(turn)
        inserted: Sequence[int] = ()
        if after is not None:
            following = tokens(after).prompt_ids or ()
            if not extends(following, t):
                raise ValueError(f"turn {after.index} does not extend turn {turn.index}")
            inserted = following[length(turn):]
        yield turn, t.completion_ids or (), inserted


def sample(chain: Chain, kind: CallKind = "main") -> Sample:
    """The chain as one sequence; raises ValueError if its turns do not extend each other.
    `kind`: what the chain's calls were for (`rollout.analysis.kinds`), carried on the row."""
    turns = chain.turns
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for turn, completion, inserted in _pieces(chain):
        ids.extend(completion)
        mask.extend([1] * len(completion))
        logprobs.extend(tokens(turn).logprobs or ())
        ids.extend(inserted)
        mask.extend([0] * len(inserted))
    if len(logprobs) != sum(mask) or len(mask) != len(ids):
        raise ValueError(f"chain from turn {turns[0].index}: ids, mask and logprobs disagree")
    reason = chain.start.reason
    return Sample(
        rollout=turns[0].rollout, turns=tuple(t.index for t in turns),
        prompt_ids=tokens(turns[0]).prompt_ids or (), completion_ids=tuple(ids),
        mask=tuple(mask), logprobs=tuple(logprobs),
        weight_versions=tuple(t.weight_version for t in turns),
        break_reason=None if reason == "first" else reason, kind=kind)


def turn_spans(chain: Chain) -> dict[int, tuple[int, int]]:
    """Where each turn's sampled ids lie in the chain's sample's `completion_ids`:
    turn index -> (start, end)."""
    spans: dict[int, tuple[int, int]] = {}
    at = 0
    for turn, completion, inserted in _pieces(chain):
        spans[turn.index] = (at, at + len(completion))
        at += len(completion) + len(inserted)
    return spans


def samples_for_rollout(turns: Sequence[Turn], kinds: Collection[CallKind] | None = None,
                        harness: str | None = None, *, keep_retried: bool = False
                        ) -> list[Sample]:
    """The rollout's chains as samples, each with its call kind; `kinds`: only chains of
    these kinds (None: all). Kinds beyond `main` need the turns' requests (read with
    bodies) and the `harness` for its hints. `keep_retried`: `grpo.train_retried`."""
    return [sample(c, kind) for c, kind in kinded_chains(turns, kinds, harness,
                                                        keep_retried=keep_retried)]


def kinded_chains(turns: Sequence[Turn], kinds: Collection[CallKind] | None = None,
                  harness: str | None = None, *, keep_retried: bool = False
                  ) -> list[tuple[Chain, CallKind]]:
    """The rollout's chains of one of `kinds` (None: all), each with its call kind."""
    found = link(turns, keep_retried=keep_retried).chains
    labels = label(found, harness)
    pairs: list[tuple[Chain, CallKind]] = [(c, chain_kind(c, labels)) for c in found]
    return [(c, k) for c, k in pairs if kinds is None or k in kinds]


def iter_samples(store: TraceReader) -> Iterator[Sample]:
    """Every sample of a run, one rollout at a time (the store yields turns by rollout)."""
    # Only the ids, status and flags are read: the raw bodies and requests stay unread.
    for _key, turns in groupby(store.iter_turns(bodies=False), key=attrgetter("rollout")):
        yield from samples_for_rollout(list(turns))


def main_chain(chains: Sequence[Chain]) -> Chain | None:
    """The agent's own conversation: most turns, then most sampled tokens, then earliest."""
    def key(chain: Chain) -> tuple[int, int, int]:
        sampled = sum(len(t.completion.tokens.completion_ids or ())
                      for t in chain.turns if t.completion is not None)
        return len(chain.turns), sampled, -chain.turns[0].index
    return max(chains, key=key, default=None)
