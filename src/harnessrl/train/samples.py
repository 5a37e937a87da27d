"""Samples: each chain of a rollout becomes one training sequence, never re-tokenized.

A chain (`harnessrl.rollout.chains`) is one `Sample`: the first prompt, then every turn's
sampled ids (mask 1, with the engine's logprobs) and the ids inserted between turns (mask
0, no logprob).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import groupby
from operator import attrgetter
from typing import TYPE_CHECKING

from harnessrl.rollout.chains import Chain, chains, extends, length, tokens
from harnessrl.types import Sample, Turn

if TYPE_CHECKING:
    from harnessrl.proxy.store import TraceReader


def sample(chain: Chain) -> Sample:
    """The chain as one sequence; raises ValueError if its turns do not extend each other."""
    turns = chain.turns
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for turn, after in zip(turns, (*turns[1:], None), strict=True):
        t = tokens(turn)
        completion = t.completion_ids or ()
        ids.extend(completion)
        mask.extend([1] * len(completion))
        logprobs.extend(t.logprobs or ())
        if after is not None:
            if not extends(tokens(after).prompt_ids or (), t):
                raise ValueError(f"turn {after.index} does not extend turn {turn.index}")
            inserted = (tokens(after).prompt_ids or ())[length(turn):]
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
        break_reason=None if reason == "first" else reason)


def turn_spans(chain: Chain) -> dict[int, tuple[int, int]]:
    """Where each turn's sampled ids lie in the chain's sample's `completion_ids`:
    turn index -> (start, end)."""
    spans: dict[int, tuple[int, int]] = {}
    at = 0
    for turn, after in zip(chain.turns, (*chain.turns[1:], None), strict=True):
        n = len(tokens(turn).completion_ids or ())
        spans[turn.index] = (at, at + n)
        at += n
        if after is not None:
            at += len(tokens(after).prompt_ids or ()) - length(turn)
    return spans


def samples_for_rollout(turns: Sequence[Turn]) -> list[Sample]:
    return [sample(c) for c in chains(turns)]


def iter_samples(store: TraceReader) -> Iterator[Sample]:
    """Every sample of a run, one rollout at a time (the store yields turns by rollout)."""
    # Only the ids, status and flags are read: the raw bodies and requests stay unread.
    for _key, turns in groupby(store.iter_turns(bodies=False), key=attrgetter("rollout")):
        yield from samples_for_rollout(list(turns))
