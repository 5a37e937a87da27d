"""Rewards: the verifier's score plus shaping terms we control, each recorded by name.

A shaping term is a function of the verdict and the rollout's trace statistics. The built
in ones reward doing the task with fewer tool calls or fewer sampled tokens, and only on a
passing rollout (a failed task earns no efficiency bonus). Custom terms are any Python
function `f(verdict, stats) -> float`, named as `module:function`.

A tool call means the same in every harness: an action the harness executed. Where the
dialect carries tool calls they are counted from the completions; a harness that parses its
actions from text (its calls offer the model no tools) is counted from its own action
record, when it keeps one (`ExitState.actions`).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal, cast

import msgspec

from harnessrl.rollout.tasks.task import Verdict
from harnessrl.settings import at_least_one, flag
from harnessrl.types import Turn

ToolCallSource = Literal["native", "harness"]


@dataclass(frozen=True)
class TraceStats:
    turns: int
    tool_calls: int
    completion_tokens: int
    tool_call_source: ToolCallSource = "native"  # where `tool_calls` was counted

    @classmethod
    def of(cls, turns: Sequence[Turn], *, executed: int | None = None) -> TraceStats:
        """Statistics of one rollout's turns. `executed` is the number of actions the
        harness's own record says it ran (None: it keeps no record). It is the count
        when no call of the rollout offered the model a tool (the harness acts on text,
        so the wire carries no tool call to count); otherwise the completions' tool
        calls are."""
        completions = [t.completion for t in turns if t.completion is not None]
        offered_tools = any(t.request is not None and t.request.tools for t in turns)
        source: ToolCallSource = "native"
        tool_calls = sum(len(c.tool_calls) for c in completions)
        if executed is not None and not offered_tools:
            source, tool_calls = "harness", executed
        return cls(
            turns=len(turns), tool_calls=tool_calls,
            completion_tokens=sum(len(c.tokens.completion_ids or ()) for c in completions),
            tool_call_source=source,
        )


ShapingTerm = Callable[[Verdict, TraceStats], float]


class Shaping(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Weights of the built-in terms (0 turns a term off) and any custom terms: the
    `[shaping]` table of the train config and `run`/`eval`'s shaping flags alike.

    `fewer_tool_calls` adds w * (1 - n/B), falling to 0 at the budget B. `tool_call_bonus`
    is the reference recipe's own form: a passing rollout's reward r becomes
    r * (1 + w * B/(B + n)), so the term is r * w * B/(B + n) (w at no call, w/2 at B).
    """

    fewer_tool_calls: Annotated[float, flag(
        "shaping: bonus weight for passing with fewer tool calls")] = 0.0
    tool_call_budget: Annotated[int, msgspec.Meta(ge=1), flag(
        "shaping: tool calls at which --fewer-tool-calls reaches 0 and --tool-call-bonus "
        "halves (default %(default)s)", metavar="B", parse=at_least_one)] = 20
    fewer_tokens: Annotated[float, flag(
        "shaping: bonus weight for passing with fewer sampled tokens")] = 0.0
    token_budget: int = 20_000  # fewer_tokens: the bonus falls linearly to 0 at this many
    tool_call_bonus: Annotated[float, flag(
        "shaping: the reference's form, a passing reward times (1 + W*B/(B + tool calls)), "
        "B = --tool-call-budget", metavar="W")] = 0.0
    # `module:function` names of f(verdict, stats) -> float, each recorded by its name
    custom: Annotated[tuple[str, ...], flag(
        "a custom shaping term f(verdict, stats) -> float (repeat)", "--shaping",
        metavar="MODULE:FUNCTION")] = ()

    def __post_init__(self) -> None:
        if self.tool_call_bonus and self.tool_call_budget < 1:
            raise ValueError(f"tool_call_budget must be at least 1 for tool_call_bonus, got "
                             f"{self.tool_call_budget}")
        for spec in self.custom:  # a name that does not load is an error now, not mid-run
            load_term(spec)

    @property
    def custom_terms(self) -> dict[str, ShapingTerm]:
        return dict(load_term(spec) for spec in self.custom)

    def terms(self, verdict: Verdict, stats: TraceStats) -> dict[str, float]:
        terms: dict[str, float] = {}
        if self.fewer_tool_calls and verdict.passed:
            terms["fewer_tool_calls"] = self.fewer_tool_calls * _under(
                stats.tool_calls, self.tool_call_budget)
        if self.tool_call_bonus and verdict.passed:
            budget = self.tool_call_budget
            terms["tool_call_bonus"] = verdict.reward * self.tool_call_bonus * budget / (
                budget + stats.tool_calls)
        if self.fewer_tokens and verdict.passed:
            terms["fewer_tokens"] = self.fewer_tokens * _under(
                stats.completion_tokens, self.token_budget)
        for name, term in self.custom_terms.items():
            terms[name] = float(term(verdict, stats))
        return terms

    def reward(self, verdict: Verdict, stats: TraceStats) -> tuple[float, dict[str, float]]:
        terms = self.terms(verdict, stats)
        return verdict.reward + sum(terms.values()), terms


def _under(used: int, budget: int) -> float:
    """1 for nothing used, falling linearly to 0 at the budget."""
    return max(0.0, 1.0 - used / budget) if budget > 0 else 0.0


@functools.cache
def load_term(spec: str) -> tuple[str, ShapingTerm]:
    """`package.module:function` -> (function name, function); a ValueError naming `spec`
    if it does not name a function."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"shaping term {spec!r}: write it as module:function")
    try:
        term = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"shaping term {spec!r}: {error}") from None
    if not callable(term):
        raise ValueError(f"shaping term {spec!r} is not a function")
    return name, cast(ShapingTerm, term)  # its signature is the user's promise
