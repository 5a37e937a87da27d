"""GRPO's choices for agent rollouts, as pure functions (no I/O): the group advantage and
its scale, which groups carry a signal, the control arm's shuffle, and which replies of a
rollout the loss leaves out or penalises.

- **Advantage.** A scored rollout's reward minus its group's mean, divided by the group's
  std (`scale_rewards = "group"`, TRL's default), by the std of the step's rewards
  (`"batch"`, applied where the step is assembled) or by nothing (`"none"`). An
  infrastructure failure has no reward: out of the mean and the std, advantage 0, no row.
  Population std, as the worker always used.
- **Spread.** A group whose scored rewards are all equal has no advantage to learn from.
- **Rejected and truncated replies.** A reply the harness dropped from its history
  (`rollout.analysis.chains.dropped_replies`) and a reply cut by `max_tokens` (finish reason
  `length`) are, per setting, masked out of the loss (`mask`), trained on their own with
  the advantage `-format_penalty` (`penalty`: a second row of the chain whose loss mask
  holds only those replies) or trained like every other reply (`train`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec

from harnessrl.rollout.analysis.chains import Chain, dropped_replies, link, tokens
from harnessrl.train.rows.samples import sample, turn_spans
from harnessrl.types import CallKind, Sample, Turn

Scale = Literal["group", "batch", "none"]
Treatment = Literal["mask", "penalty", "train"]
Flag = Literal["rejected", "truncated"]
EPS = 1e-8  # TRL's, added to every std it divides by


@dataclass(frozen=True)
class RowSettings:
    """What `GRPOSettings` says about turning rollouts into rows (the fields of the same
    names); kept apart so the pure functions need no config."""

    scale_rewards: Scale = "group"
    rejected_turns: Treatment = "mask"
    truncated_turns: Treatment = "mask"
    format_penalty: float = 1.0
    advantage_control: Literal["none", "shuffle"] = "none"
    seed: int = 0

    def treatment(self, flag: Flag) -> Treatment:
        return self.rejected_turns if flag == "rejected" else self.truncated_turns


@dataclass(frozen=True)
class ChainRow:
    """One row of a chain: its sample (with the loss mask as trained), its advantage,
    the replies it leaves out or penalises (turn, flag), and whether it is the chain's
    own row (`rollout`) or the penalty row of its flagged replies (`penalty`)."""

    sample: Sample
    advantage: float
    flagged: tuple[tuple[int, Flag], ...] = ()
    kind: Literal["rollout", "penalty"] = "rollout"


# ------------------------------------------------------------------ advantages
def scored(rewards: Sequence[float | None]) -> list[float]:
    return [r for r in rewards if r is not None]


def std(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5


def group_advantages(rewards: Sequence[float | None], scale: Scale = "group") -> list[float]:
    """Each rollout's advantage in its group; 0 for None (no reward). With `"batch"` the
    advantages are centred only: the step divides them by its rewards' std."""
    values = scored(rewards)
    if not values:
        return [0.0] * len(rewards)
    mean = sum(values) / len(values)
    divisor = std(values) + EPS if scale == "group" else 1.0
    return [0.0 if r is None else (r - mean) / divisor for r in rewards]


def has_spread(rewards: Sequence[float | None]) -> bool:
    """Whether the group's scored rewards differ (two or more of them, not all equal)."""
    values = scored(rewards)
    return len(values) > 1 and max(values) > min(values)


def shuffled(advantages: Sequence[float], rewards: Sequence[float | None], seed: int,
             group: int) -> list[float]:
    """The control arm: the scored rollouts' advantages permuted among them, the same
    permutation for the same seed and group; infrastructure failures keep their 0."""
    positions = [i for i, r in enumerate(rewards) if r is not None]
    values = [advantages[i] for i in positions]
    random.Random(f"{seed}:{group}").shuffle(values)
    out = list(advantages)
    for i, v in zip(positions, values, strict=True):
        out[i] = v
    return out


def batch_divisor(rewards: Sequence[float]) -> float:
    """`scale_rewards = "batch"`: the std of every scored reward of the step."""
    return std(rewards) + EPS


# ------------------------------------------------------------------ flagged replies
def flagged_turns(turns: Sequence[Turn]) -> dict[int, Flag]:
    """The rollout's replies cut by max_tokens (`truncated`) or dropped by the harness
    (`rejected`); a truncated reply the harness then dropped counts as truncated, its
    cause."""
    if not turns:
        return {}
    linked = link(turns)
    out: dict[int, Flag] = dict.fromkeys(dropped_replies(linked), "rejected")
    for chain in linked.chains:
        for turn in chain.turns:
            if turn.completion is not None and turn.completion.finish_reason == "length":
                out[turn.index] = "truncated"
    return out


def chain_rows(chain: Chain, advantage: float, flags: Mapping[int, Flag],
               settings: RowSettings, kind: CallKind = "main") -> list[ChainRow]:
    """The chain's rows: its own (flagged replies masked or kept per setting) and, when a
    flagged reply is penalised, a penalty row holding only those replies' tokens. A row
    with no sampled token left is not made. `kind`: the chain's call kind, on its rows."""
    base = sample(chain, kind)
    spans = turn_spans(chain)
    mine: list[tuple[int, Flag]] = [(t.index, flags[t.index]) for t in chain.turns
                                    if t.index in flags and tokens(t).completion_ids]
    off = [(i, f) for i, f in mine if settings.treatment(f) != "train"]
    penalised: list[tuple[int, Flag]] = [(i, f) for i, f in mine
                                         if settings.treatment(f) == "penalty"]
    rows = []
    own = _masked(base, [spans[i] for i, _ in off], keep=False)
    if any(own.mask):
        rows.append(ChainRow(own, advantage, tuple(mine)))
    if penalised:
        rows.append(ChainRow(_masked(base, [spans[i] for i, _ in penalised], keep=True),
                             -settings.format_penalty, tuple(penalised), "penalty"))
    return rows


def masked_chain(chain: Chain, flags: Mapping[int, Flag], settings: RowSettings) -> Sample:
    """The chain as one sample with its flagged replies masked per setting (the sync
    trainer's one row per rollout: a penalty needs a row of its own, which it has not)."""
    spans = turn_spans(chain)
    off = [spans[t.index] for t in chain.turns
           if t.index in flags and settings.treatment(flags[t.index]) != "train"]
    return _masked(sample(chain), off, keep=False)


def _masked(s: Sample, spans: Sequence[tuple[int, int]], *, keep: bool) -> Sample:
    """`s` with its loss mask cleared on `spans` (keep=False) or everywhere else."""
    if not spans:
        return s
    inside = [False] * len(s.mask)
    for start, end in spans:
        inside[start:end] = [True] * (end - start)
    mask = tuple(m if inside[i] == keep else 0 for i, m in enumerate(s.mask))
    return msgspec.structs.replace(s, mask=mask, logprobs=tuple(
        lp for lp, m in zip(s.dense_logprobs(0.0), mask, strict=True) if m))
