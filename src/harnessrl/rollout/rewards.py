"""Rewards: the verifier's score plus shaping terms we control, each recorded by name.

A shaping term is a function of the verdict and the rollout's trace statistics. The built
in ones reward doing the task with fewer tool calls or fewer sampled tokens, and only on a
passing rollout (a failed task earns no efficiency bonus). Custom terms are any Python
function `f(verdict, stats) -> float`, named as `module:function`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from harnessrl.rollout.tasks import Verdict
from harnessrl.types import Turn


@dataclass(frozen=True)
class TraceStats:
    turns: int
    tool_calls: int
    completion_tokens: int

    @classmethod
    def of(cls, turns: Sequence[Turn]) -> TraceStats:
        completions = [t.completion for t in turns if t.completion is not None]
        return cls(
            turns=len(turns),
            tool_calls=sum(len(c.tool_calls) for c in completions),
            completion_tokens=sum(len(c.tokens.completion_ids or ()) for c in completions),
        )


ShapingTerm = Callable[[Verdict, TraceStats], float]


@dataclass(frozen=True)
class Shaping:
    """Weights of the built-in terms (0 turns a term off) and any custom terms."""

    fewer_tool_calls: float = 0.0
    tool_call_budget: int = 20
    fewer_tokens: float = 0.0
    token_budget: int = 20_000
    custom: dict[str, ShapingTerm] = field(default_factory=dict)

    def terms(self, verdict: Verdict, stats: TraceStats) -> dict[str, float]:
        terms: dict[str, float] = {}
        if self.fewer_tool_calls and verdict.passed:
            terms["fewer_tool_calls"] = self.fewer_tool_calls * _under(
                stats.tool_calls, self.tool_call_budget)
        if self.fewer_tokens and verdict.passed:
            terms["fewer_tokens"] = self.fewer_tokens * _under(
                stats.completion_tokens, self.token_budget)
        for name, term in self.custom.items():
            terms[name] = float(term(verdict, stats))
        return terms

    def reward(self, verdict: Verdict, stats: TraceStats) -> tuple[float, dict[str, float]]:
        terms = self.terms(verdict, stats)
        return verdict.reward + sum(terms.values()), terms


def _under(used: int, budget: int) -> float:
    """1 for nothing used, falling linearly to 0 at the budget."""
    return max(0.0, 1.0 - used / budget) if budget > 0 else 0.0


def load_term(spec: str) -> tuple[str, ShapingTerm]:
    """`package.module:function` -> (function name, function)."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"shaping term {spec!r}: write it as module:function")
    term = getattr(importlib.import_module(module), name)
    if not callable(term):
        raise ValueError(f"shaping term {spec!r} is not a function")
    return name, cast(ShapingTerm, term)  # its signature is the user's promise
