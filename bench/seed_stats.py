"""The three-seed experiment's statistics (issue 46), pure functions over the seed table's
records: the power estimate that sizes it, the calibration's task selection, and the
pooled paired statistics (bootstrap interval, exact sign test) its report gives.

A paired unit is one held-out task in one seed: its pass rate under an arm (over the
eval's samples) minus its pass rate under the reference (the seed's start, or the seed's
control arm), on the same task. Pooling the seeds pools those units."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from statistics import NormalDist, fmean, stdev
from typing import Any


# ------------------------------------------------------------------ sizing
def detectable_change(start_rates: Sequence[float], samples: int, seeds: int = 1,
                      alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest change in mean pass rate (a fraction; 0.1 is 10 points) that a paired
    comparison of two evals detects with this power at this two-sided alpha: each of the
    tasks (with the start's pass rates `start_rates`) evaluated with `samples` rollouts per
    arm, in each of `seeds` seeds. Under no change a task's paired difference has variance
    2 p (1 - p) / samples (two independent evals of the same rate), so the mean over the
    N = tasks x seeds units has sd sqrt(sum 2 p (1 - p) / samples) / N, and the change
    seen is (z_{1-alpha/2} + z_power) of those. It counts eval noise only: the spread of
    training itself between seeds adds to it (the control arm measures that)."""
    if samples < 1 or seeds < 1 or not start_rates:
        raise ValueError("detectable_change needs tasks, samples >= 1 and seeds >= 1")
    if not all(0.0 <= p <= 1.0 for p in start_rates):
        raise ValueError("pass rates are fractions in [0, 1]")
    units = len(start_rates) * seeds
    variance = seeds * sum(2 * p * (1 - p) / samples for p in start_rates)
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    return z * math.sqrt(variance) / units


def spread_share(rate: float, group: int) -> float:
    """The chance that a group of `group` rollouts of a task passed at `rate` has reward
    spread (neither all pass nor all fail): only such a group has a GRPO advantage."""
    return 1.0 - rate ** group - (1.0 - rate) ** group


def expected_spread(rates: Iterable[float], group: int) -> float | None:
    """The share of groups with spread expected when groups are drawn evenly from tasks
    with these pass rates."""
    shares = [spread_share(p, group) for p in rates]
    return fmean(shares) if shares else None


# ------------------------------------------------------------------ calibration
def rates(per_task: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """(passed, scored) per task from an eval cell's per-rollout records (keys `task` or
    `task#sample`); infrastructure errors are not scored."""
    found: dict[str, list[int]] = {}
    for key, rollout in per_task.items():
        counts = found.setdefault(key.split("#", 1)[0], [0, 0])
        if rollout["status"] == "done":
            counts[0] += bool(rollout["passed"])
            counts[1] += 1
    return {task: (a, n) for task, (a, n) in sorted(found.items())}


def calibrated(units: Mapping[str, Mapping[str, Any]], label: str, split: str, harness: str
               ) -> dict[str, tuple[int, int]]:
    """Every calibrated task's (passed, scored) for a start label (`sft-s0-t1`), split and
    harness: the cells `calib/LABEL/SPLIT/TIER/cN/HARNESS` pooled."""
    found: dict[str, tuple[int, int]] = {}
    for key, cell in units.items():
        parts = key.split("/")
        if len(parts) == 6 and parts[1] == label and parts[2] == split and parts[5] == harness:
            found |= rates(cell["per_task"])
    return dict(sorted(found.items()))


def select(task_rates: Mapping[str, tuple[int, int]], band: Sequence[float], k: int = 0,
           seed: str = "select") -> list[str]:
    """The tasks whose pass rate (passed / scored, a task with none scored left out) lies
    in [low, high]; a fixed seeded subset of k of them when there are more (0: all)."""
    low, high = band
    inside = sorted(t for t, (a, n) in task_rates.items() if n and low <= a / n <= high)
    if k and len(inside) > k:
        return sorted(random.Random(seed).sample(inside, k))
    return inside


# ------------------------------------------------------------------ pooled paired statistics
def paired_differences(arm: Mapping[str, Mapping[str, Any]],
                       reference: Mapping[str, Mapping[str, Any]]) -> list[float]:
    """Per task scored in both cells (one seed, one harness): the arm's pass rate minus the
    reference's."""
    a, b = rates(arm), rates(reference)
    return [a[t][0] / a[t][1] - b[t][0] / b[t][1] for t in sorted(a)
            if a[t][1] and t in b and b[t][1]]


def bootstrap_mean(values: Sequence[float], reps: int = 4000, seed: int = 0,
                   level: float = 0.95) -> tuple[float, float, float]:
    """The mean and its percentile bootstrap interval (units resampled with replacement,
    a seeded generator so the report is reproducible)."""
    if not values:
        raise ValueError("bootstrap_mean of no values")
    rng, n = random.Random(seed), len(values)
    means = sorted(fmean(rng.choices(values, k=n)) for _ in range(reps))
    tail = (1 - level) / 2
    return (fmean(values), means[int(tail * reps)],
            means[min(reps - 1, int((1 - tail) * reps))])


def sign_test(gained: int, lost: int) -> float:
    """Exact two-sided binomial test of gained vs lost at p = 1/2 (1.0 for none)."""
    n, k = gained + lost, min(gained, lost)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0


def signs(differences: Iterable[float]) -> tuple[int, int]:
    """(units the arm did better on, units it did worse on); ties are dropped."""
    values = list(differences)
    return sum(d > 0 for d in values), sum(d < 0 for d in values)


def interval_over_seeds(values: Sequence[float], level: float = 0.95
                        ) -> tuple[float, float | None, float | None]:
    """The mean of per-seed values and its t interval (None with one seed): wide with
    three seeds, as it should be."""
    mean = fmean(values)
    if len(values) < 2:
        return mean, None, None
    half = _t_quantile(1 - (1 - level) / 2, len(values) - 1) * stdev(values) / math.sqrt(
        len(values))
    return mean, mean - half, mean + half


def _t_quantile(q: float, df: int) -> float:
    """Student's t quantile by bisection on its CDF, the density integrated numerically
    (no scipy here; three seeds need df 2, where this is exact to 1e-4)."""
    def cdf(x: float) -> float:
        steps, total = 2000, 0.0
        c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)
                     - 0.5 * math.log(df * math.pi))
        for i in range(steps):  # midpoint rule on [0, x]
            t = (i + 0.5) * x / steps
            total += c * (1 + t * t / df) ** (-(df + 1) / 2)
        return 0.5 + total * x / steps

    low, high = 0.0, 100.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < q else (low, mid)
    return (low + high) / 2
