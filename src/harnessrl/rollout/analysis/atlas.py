"""The drift atlas: per harness and model family, how a run's turns sort into chains, why
chains broke (`rollout.analysis.drift` causes, an example each) and what each call was for
(`rollout.analysis.kinds`). `harnessrl report`, the viewer and `conformance --drift` show it.

Causes and kinds need the turns' canonical requests: the store is read one rollout at a
time with bodies (`TraceReader.turns`), never the layout underneath.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

import msgspec

from harnessrl.rollout.analysis.chains import ChainStats, harness_of, link, rollout_stats
from harnessrl.rollout.analysis.drift import Drift, drifts
from harnessrl.rollout.analysis.kinds import label
from harnessrl.types import Rollout, Turn

if TYPE_CHECKING:
    from harnessrl.store.reader import TraceReader


def family(model: str | None) -> str:
    """A model's family as a run names it: the last part of a path or hub name."""
    if not model:
        return "unknown"
    return PurePath(model.rstrip("/")).name or model


@dataclass(slots=True)
class Entry:
    """One harness with one model family: chain counts, causes, kinds, an example each."""

    stats: ChainStats = field(default_factory=ChainStats)
    causes: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    examples: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def extension_rate(self) -> float | None:
        """Of the turns that continued a conversation, the share that extended it: as
        `ChainStats.extension_rate`, but a break the causes call another conversation
        (`side_call`, e.g. a title call then the agent's own) or a retry (`rewound`)
        continues nothing."""
        drifted = sum(n for c, n in self.causes.items() if c not in ("side_call", "rewound"))
        continuing = self.stats.extended + drifted
        return self.stats.extended / continuing if continuing else None

    @property
    def rows_per_rollout(self) -> float | None:
        return self.stats.chains / self.stats.rollouts if self.stats.rollouts else None

    def add(self, key: str, turns: Sequence[Turn], harness: str | None) -> None:
        self.stats.add(rollout_stats(turns) if turns else ChainStats(rollouts=1))
        if not turns:
            return
        chains = link(turns).chains
        kinds = label(chains, harness)
        self.kinds.update(kinds.values())
        for drift in drifts(chains, kinds):
            self.causes[drift.cause] += 1
            self.examples.setdefault(drift.cause, example(key, drift))

    def to_dict(self) -> dict[str, Any]:
        return {**self.stats.to_dict(), "extension_rate": self.extension_rate,
                "rows_per_rollout": self.rows_per_rollout,
                "causes": dict(self.causes), "kinds": dict(self.kinds),
                "examples": self.examples}


def example(key: str, drift: Drift) -> dict[str, Any]:
    return {"rollout": key, **msgspec.to_builtins(drift)}


Atlas = dict[tuple[str, str], Entry]


def build_atlas(traces: Iterable[tuple[Rollout | None, Sequence[Turn]]]) -> Atlas:
    atlas: Atlas = {}
    for rollout, turns in traces:
        harness = harness_of(rollout)
        key = rollout.key if rollout is not None else turns[0].rollout
        model = next((t.model for t in turns if t.model), None)
        entry = atlas.setdefault((harness, family(model)), Entry())
        entry.add(key, turns, None if harness == "unknown" else harness)
    return atlas


def atlas(store: TraceReader) -> Atlas:
    """The atlas of every rollout in the store, one rollout's turns in memory at a time."""
    rollouts = {r.key: r for r in store.iter_rollouts()}
    keys = [*rollouts, *(k for k in store.turn_counts() if k not in rollouts)]
    return build_atlas((rollouts.get(k), store.turns(k)) for k in keys
                       if k in rollouts or store.turn_counts().get(k))


def atlas_dict(found: Atlas) -> list[dict[str, Any]]:
    return [{"harness": h, "family": f, **e.to_dict()} for (h, f), e in sorted(found.items())]
