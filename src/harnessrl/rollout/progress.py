"""The live view of a run: a rich progress bar with pass rate, turns and tokens so far,
and the per-harness summary printed at the end."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harnessrl.types import Outcome


class RunProgress:
    def __init__(self, total: int) -> None:
        self.progress = Progress(
            TextColumn("[bold]rollouts"), BarColumn(), MofNCompleteColumn(),
            TextColumn("pass {task.fields[rate]}"), TextColumn("turns {task.fields[turns]}"),
            TextColumn("tokens {task.fields[tokens]}"),
            TextColumn("infra errors {task.fields[infra]}"), TimeElapsedColumn())
        self.task = self.progress.add_task("run", total=total, rate="-", turns=0, tokens=0,
                                           infra=0)
        self.outcomes: list[Outcome] = []

    def __enter__(self) -> RunProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def update(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        done = [o for o in self.outcomes if o.status == "done"]
        passed = sum(1 for o in done if (o.verifier_reward or 0) >= 1)
        self.progress.update(
            self.task, advance=1, rate=f"{passed}/{len(done)}" if done else "-",
            turns=sum(o.turns for o in self.outcomes),
            tokens=sum(o.completion_tokens for o in self.outcomes),
            infra=len(self.outcomes) - len(done))


def summary(outcomes: Sequence[Outcome]) -> Table:
    """Per harness: rollouts, pass rate, mean reward, tool calls and tokens per solved task."""
    table = Table("harness", "rollouts", "passed", "pass rate", "mean reward",
                  "tool calls / solved", "tokens / solved", "infra errors", "capped",
                  title="evaluation per harness")
    by_harness: dict[str, list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        by_harness[outcome.harness].append(outcome)
    for name, group in sorted(by_harness.items()):
        done = [o for o in group if o.status == "done"]
        solved = [o for o in done if (o.verifier_reward or 0) >= 1]
        rewards = [o.reward for o in done if o.reward is not None]
        table.add_row(
            name, str(len(group)), str(len(solved)),
            f"{len(solved) / len(done):.0%}" if done else "-",
            f"{sum(rewards) / len(rewards):.3f}" if rewards else "-",
            f"{sum(o.tool_calls for o in solved) / len(solved):.1f}" if solved else "-",
            f"{sum(o.completion_tokens for o in solved) / len(solved):.0f}" if solved else "-",
            str(len(group) - len(done)), str(sum(o.capped for o in done)))
    return table
