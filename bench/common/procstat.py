"""What the load bench reads from /proc: a process's RSS and CPU, its loop thread's wait
for a CPU, and what the rest of the machine did meanwhile."""

from __future__ import annotations

import contextlib
import math
import os
from collections import Counter
from pathlib import Path


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run_delay_s(pid: int) -> float:
    """How long the proxy's event-loop thread waited for a CPU while runnable (schedstat):
    lag the box causes, not the proxy."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[1]) / 1e9


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds of every process on the machine, to say what else ran meanwhile."""
    out: dict[int, tuple[str, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                raw = Path(f"/proc/{entry}/stat").read_text()
                name = raw[raw.index("(") + 1:raw.rindex(")")]
                fields = raw.rsplit(")", 1)[1].split()
                out[int(entry)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def others(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
           ours: set[int], wall: float) -> str:
    """The busiest other processes over the run, as '% of a core' by process name (those
    that exited meanwhile are not seen: `busy_percent` counts them)."""
    by_name: Counter[str] = Counter()
    for pid, (name, cpu) in after.items():
        if pid not in ours:
            by_name[name] += cpu - before.get(pid, (name, 0.0))[1]
    busy = [(n, c / wall * 100) for n, c in by_name.most_common(6) if c / wall >= 0.02]
    total = sum(c for c in by_name.values()) / wall * 100
    return (f"{total:.0f}% of a core in total: "
            + ", ".join(f"{n} {p:.0f}%" for n, p in busy)) if busy else "nothing else busy"


def machine_ticks() -> tuple[int, int]:
    """(busy, all) CPU ticks of the whole machine since boot, from /proc/stat."""
    user, nice, system, idle, iowait, irq, softirq, steal = map(
        int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9])
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


def busy_percent(before: tuple[int, int], after: tuple[int, int]) -> float:
    """How busy the machine was between two readings, in % of one core (200% = 2 cores):
    unlike the per-process list, this counts processes that came and went meanwhile."""
    span = after[1] - before[1]
    return (after[0] - before[0]) / span * 100 * (os.cpu_count() or 1) if span else math.nan
