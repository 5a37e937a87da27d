"""What every benchmark here reports in: rows of a figure against its same-run baseline."""

from __future__ import annotations

import math
import os
import platform
import timeit
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Row:
    """One line of a results table: a figure, its baseline from the same run, a target."""

    figure: str
    measured: str
    baseline: str = ""
    target: str = ""
    verdict: str = ""


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, NaNs left out."""
    ordered = sorted(v for v in values if not math.isnan(v))
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def md_table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]


def figure_table(rows: Sequence[Row]) -> list[str]:
    return md_table(("figure", "measured", "baseline (same run)", "target", "verdict"),
                    [(r.figure, r.measured, r.baseline, r.target, r.verdict) for r in rows])


def machine_line() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh
                          if line.startswith("model name")), "")
    except OSError:
        pass
    return (f"Machine: {os.cpu_count()} cores ({model}), Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}; {python_speed()}")


def python_speed() -> str:
    """One fixed loop timed, so runs on different VMs can be set side by side: the same
    model name has given the same code 1.5-2x apart in CPU here between sessions."""
    best = min(timeit.repeat("sum(range(100))", number=100_000, repeat=5)) / 100_000
    return f"`sum(range(100))` takes {best * 1e6:.2f} µs"
