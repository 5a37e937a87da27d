"""Per-harness evaluation: the same model across harnesses on a task set, side by side.

Pass rate with a Wilson 95% interval (honest at small n and at 0% or 100%), pass@k with
the unbiased estimator over each task's samples, and tool calls and tokens per solved
task. Infrastructure failures are counted apart and left out of every rate. Rollouts the
proxy stopped at their step cap are scored like any other, and counted (`capped`).
"""

from __future__ import annotations

import csv
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from harnessrl.types import Outcome


@dataclass(frozen=True)
class HarnessEval:
    harness: str
    version: str
    tasks: int
    rollouts: int  # scored ones
    passed: int
    pass_rate: float | None
    ci_low: float | None
    ci_high: float | None
    pass_at_k: float | None
    k: int
    tool_calls_per_solved: float | None
    tokens_per_solved: float | None
    infra_errors: int
    capped: int = 0  # scored rollouts stopped at their step cap (max_model_calls)


def wilson(passed: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = passed / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that at least one of k samples (of n, c correct) passes."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def evaluate(outcomes: Sequence[Outcome], k: int) -> list[HarnessEval]:
    by_harness: dict[str, list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        by_harness[outcome.harness].append(outcome)
    return [_one(name, group, k) for name, group in sorted(by_harness.items())]


def _one(name: str, group: list[Outcome], k: int) -> HarnessEval:
    done = [o for o in group if o.status == "done"]
    solved = [o for o in done if (o.verifier_reward or 0) >= 1]
    per_task: dict[str, list[bool]] = defaultdict(list)
    for o in done:
        per_task[o.task].append((o.verifier_reward or 0) >= 1)
    estimates = [pass_at_k(len(s), sum(s), k) for s in per_task.values() if len(s) >= k]
    low, high = wilson(len(solved), len(done)) if done else (None, None)
    return HarnessEval(
        harness=name, version=group[0].harness_version, tasks=len(per_task),
        rollouts=len(done), passed=len(solved),
        pass_rate=len(solved) / len(done) if done else None, ci_low=low, ci_high=high,
        pass_at_k=sum(estimates) / len(estimates) if estimates else None, k=k,
        tool_calls_per_solved=_mean([o.tool_calls for o in solved]),
        tokens_per_solved=_mean([o.completion_tokens for o in solved]),
        infra_errors=len(group) - len(done), capped=sum(o.capped for o in done))


def _mean(values: list[int]) -> float | None:
    return sum(values) / len(values) if values else None


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


def markdown(rows: Sequence[HarnessEval]) -> str:
    lines = ["| harness | version | tasks | rollouts | passed | pass rate (95% CI) | pass@k "
             "| tool calls / solved | tokens / solved | infra errors | capped |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rate = ("-" if r.pass_rate is None else
                f"{r.pass_rate:.0%} ({r.ci_low:.0%}-{r.ci_high:.0%})")
        lines.append(f"| {r.harness} | {r.version} | {r.tasks} | {r.rollouts} | {r.passed} | "
                     f"{rate} | {_fmt(r.pass_at_k, '.2f')} (k={r.k}) | "
                     f"{_fmt(r.tool_calls_per_solved, '.1f')} | "
                     f"{_fmt(r.tokens_per_solved, '.0f')} | {r.infra_errors} | "
                     f"{r.capped} |")
    return "\n".join(lines) + "\n"


def write_csv(rows: Sequence[HarnessEval], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(HarnessEval.__dataclass_fields__))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)


class PlotUnavailable(ImportError):
    """matplotlib, which only eval.png needs, is not installed."""


def plot(rows: Sequence[HarnessEval], path: Path) -> None:
    """Pass rate per harness with its 95% interval, as a PNG (the `plot` extra)."""
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotUnavailable("eval.png needs matplotlib, which is not installed: "
                              "pip install 'harnessrl[plot]'") from exc

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # (harness, rate, interval): a harness with a scored rollout has all three
    scored = [(r.harness, r.pass_rate, r.ci_low, r.ci_high) for r in rows
              if r.pass_rate is not None and r.ci_low is not None and r.ci_high is not None]
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(scored) + 2), 3.5))
    errors = [[rate - low for _, rate, low, _ in scored],
              [high - rate for _, rate, _, high in scored]]
    ax.bar([name for name, *_ in scored], [rate for _, rate, *_ in scored], yerr=errors,
           capsize=4, color="#4c78a8")
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass rate (95% CI)")
    ax.set_title("same model, different harnesses")
    fig.autofmt_xdate(rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_all(rows: Sequence[HarnessEval], directory: Path) -> list[Path]:
    """eval.md, eval.csv and eval.png in `directory`; the paths written. Without matplotlib
    the plot is skipped with a note: the tables are the result."""
    directory.mkdir(parents=True, exist_ok=True)
    md, table, png = directory / "eval.md", directory / "eval.csv", directory / "eval.png"
    md.write_text(markdown(rows))
    write_csv(rows, table)
    try:
        plot(rows, png)
    except PlotUnavailable as exc:
        print(f"harnessrl: {exc} (eval.png skipped)", file=sys.stderr)
        return [md, table]
    return [md, table, png]
