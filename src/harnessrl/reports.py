"""Report tables for the command line (`harnessrl report`, the demo): rich renderings of
what `harnessrl.rollout.analysis.chains` computes."""

from __future__ import annotations

from collections import Counter

from rich.console import Group
from rich.table import Table

from harnessrl.rollout.analysis.atlas import Atlas, Entry
from harnessrl.rollout.analysis.chains import ChainStats, Report

_COLUMNS = ("rollouts", "turns", "trainable", "chains", "extended", "ext. rate", "breaks",
            "excluded", "capped")


def _cells(stats: ChainStats) -> list[str]:
    rate = stats.extension_rate
    return [str(stats.rollouts), str(stats.turns), str(stats.trainable), str(stats.chains),
            str(stats.extended), "-" if rate is None else f"{rate:.0%}",
            _counts(stats.breaks), _counts(stats.excluded), str(stats.capped)]


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(counter.items())) or "-"


def render_report(report: Report, *, rollouts: bool = True) -> Group:
    """The report as rich tables: one row per harness, then (optionally) per rollout."""
    by_harness = Table(title="chains per harness")
    for column in ("harness", *_COLUMNS):
        by_harness.add_column(column)
    for harness, stats in sorted(report.harnesses.items()):
        by_harness.add_row(harness, *_cells(stats))
    tables: list[Table] = [by_harness]
    if rollouts:
        by_rollout = Table(title="chains per rollout")
        for column in ("rollout", "harness", *_COLUMNS[1:]):
            by_rollout.add_column(column)
        for key, (harness, stats) in report.rollouts.items():
            by_rollout.add_row(key, harness, *_cells(stats)[1:])
        tables.append(by_rollout)
    return Group(*tables)


_ATLAS = ("harness", "model family", "rollouts", "turns", "ext. rate", "rows / rollout",
          "breaks by cause", "calls by kind")


def atlas_cells(harness: str, fam: str, entry: Entry) -> list[str]:
    rate, rows = entry.extension_rate, entry.rows_per_rollout
    return [harness, fam, str(entry.stats.rollouts), str(entry.stats.turns),
            "-" if rate is None else f"{rate:.0%}", "-" if rows is None else f"{rows:.2f}",
            _counts(entry.causes), _counts(entry.kinds)]


def render_atlas(found: Atlas) -> Group:
    """The drift atlas: one row per harness and model family, then one example per cause
    (the text on both sides of the first difference)."""
    table = Table(title="drift atlas")
    for column in _ATLAS:
        table.add_column(column)
    examples = Table(title="one example per cause")
    for column in ("harness", "cause", "rollout / turn", "the chain had", "the prompt has"):
        examples.add_column(column, overflow="fold")
    for (harness, fam), entry in sorted(found.items()):
        table.add_row(*atlas_cells(harness, fam, entry))
        for cause, ex in sorted(entry.examples.items()):
            examples.add_row(harness, cause, f"{ex['rollout']} / {ex['turn']}",
                             _short(ex.get("old_text")), _short(ex.get("new_text")))
    return Group(table, examples)


def _short(text: str | None, width: int = 120) -> str:
    if not text:
        return "-"
    flat = text.replace("\n", "⏎")
    return flat if len(flat) <= width else flat[:width] + "…"
