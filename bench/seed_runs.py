"""bench/seed_table.py's report, its training runs: a run's steps as a table, the first
third of its steps against the last, the runs not finished (from their progress lines as
last kept) and the runs set aside (a recipe replaced, or a run lost and started again)."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean
from typing import Any

from arms import step_lines
from seed_pooled import pct
from seed_state import PROGRESS, merged


def rl_lines(key: str, unit: dict[str, Any]) -> list[str]:
    """An RL arm's steps, read again from its run's metrics.jsonl (what the unit recorded
    may predate a fix to the reading): steps with a gradient, pass rate per step."""
    metrics = Path(unit["model"]).parent / "metrics.jsonl"
    steps = step_lines(metrics) if metrics.is_file() else unit.get("steps", [])
    moved = sum((s.get("grad_norm") or 0) > 0 for s in steps)
    resumed = " (resumed from a checkpoint)" if unit.get("resumed") else ""
    recipe = unit.get("recipe")
    lines = [f"- `{key}` ({', '.join(unit.get('harnesses', []))}): {len(steps)} steps in "
             f"{unit['seconds'] / 60:.0f} min{resumed}; {moved} of them with a gradient (a "
             f"step whose groups each scored alike has no advantage; before issue 45 AdamW's "
             f"moments still moved the weights on it, now the optimizer skips it)"
             f"{thirds(steps, unit.get('harnesses', []))}."
             + (f" Recipe: `{json.dumps(recipe)}`." if recipe else "")]
    return lines + per_step(steps, unit.get("harnesses", []), unit.get("evals", []))


def thirds(steps: list[dict[str, Any]], harnesses: list[str]) -> str:
    """The training pass rate over a run's first third of steps against its last, per
    harness (the mean of the steps' rates): did training move what it sampled?"""
    n = len(steps) // 3
    if n == 0:
        return ""
    def rate(part: list[dict[str, Any]], h: str) -> str:
        values = [r for s in part if (r := s["harnesses"].get(h, {}).get("pass_rate"))
                  is not None]
        return pct(fmean(values)) if values else "-"
    return "; training pass rate, first third of the steps against the last: " + ", ".join(
        f"{h} {rate(steps[:n], h)} -> {rate(steps[-n:], h)}" for h in harnesses)


def per_step(steps: list[dict[str, Any]], harnesses: list[str], evals: list[dict[str, Any]]
             ) -> list[str]:
    """A run's steps as a table (training pass rate and model calls per rollout per
    harness, the share of groups with reward spread, of replies cut at max_tokens, of
    replies the harness dropped, of sampled tokens trained, the gradient norm before
    clipping), then its evals while training."""
    def of(s: dict[str, Any], h: str, key: str) -> Any:
        return s.get("harnesses", {}).get(h, {}).get(key)

    columns = [(f"{h} {name}", lambda s, h=h, key=key, show=show: show(of(s, h, key)))
               for h in harnesses for name, key, show in (
                   ("pass rate", "pass_rate", pct), ("model calls", "turns", _one))]
    columns += [("groups with spread", lambda s: pct(s.get("groups_with_spread"))),
                ("cut", lambda s: pct(s.get("truncated_share"))),
                ("rejected", lambda s: pct(s.get("rejected_share"))),
                ("trained", lambda s: pct(s.get("tokens_trained_share"))),
                ("grad norm", lambda s: num(s.get("grad_norm")))]
    lines = ["", "  | step | " + " | ".join(name for name, _ in columns) + " |",
             "  |---|" + "---|" * len(columns),
             *[f"  | {s['step']} | " + " | ".join(cell(s) for _, cell in columns) + " |"
               for s in steps], ""] if steps else []
    return lines + [f"  - eval while training, step {e['step']}: " + ", ".join(
        f"{h} {v['passed']}/{v['rollouts']}" for h, v in e["eval"].items()) for e in evals]


def runs(folder: Path, measured: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The training runs kept in `folder` (STATE/progress/ or a replaced recipe's) and not
    in `measured`, from their metrics.jsonl as last kept: steps and evals so far, shaped as
    a finished unit's."""
    from harnessrl.train.runs.eval_during import eval_lines

    found = {}
    for path in sorted(folder.glob("*" + PROGRESS)):
        name = path.name.removesuffix(PROGRESS).replace("__", "/")
        if name not in (measured or {}):
            found[name] = {"steps": step_lines(path), "evals": eval_lines(path)}
    return found


def in_progress(root: Path, measured: dict[str, Any]) -> list[str]:
    """Training units not finished: the steps so far, each step's figures and the evals
    while training, so a run cut by a session's end or a lost machine still shows them."""
    return [line for name, run in runs(root / "progress", measured).items()
            for line in _run_lines(name, run)]


def replaced(root: Path) -> list[str]:
    """The runs set aside (STATE/replaced/<time>/: a recipe replaced, or a run's
    checkpoints lost): why, the steps of the runs not finished as they were measured, and
    the finished arms' training and eval cells (pass counts: the figures they gave)."""
    lines = []
    for folder in sorted((root / "replaced").glob("*")):
        why = (folder / "why.txt").read_text().strip() if (folder / "why.txt").is_file() else ""
        units, partial = merged({p.stem.replace("__", "/"): json.loads(p.read_text())
                                 for p in sorted((folder / "units").glob("*.json"))})
        lines += [f"### {folder.name}", "", why, ""]
        kept = runs(folder / "progress")  # a finished run's lines as kept: the fuller reading
        for name, run in kept.items():
            lines += [] if name in units else _run_lines(name, run)
        for key, unit in units.items():
            lines += (rl_lines(key, {**unit, **kept.get(key, {})}) if "steps" in unit
                      else [_cell_line(key, unit)])
        lines += [f"- `{cell}`: {n} of {total} chunks measured" for cell, (n, total)
                  in sorted(partial.items())]
        lines.append("")
    return lines


def _cell_line(key: str, unit: dict[str, Any]) -> str:
    scored = [t for t in unit.get("per_task", {}).values() if t["status"] == "done"]
    capped = unit.get("eval", {}).get("capped")
    return (f"- `{key}`: {sum(t['passed'] for t in scored)}/{len(scored)} passed"
            + (f", {capped} stopped at the step cap" if capped else ""))


def _run_lines(name: str, run: dict[str, Any]) -> list[str]:
    steps = run["steps"]
    moved = sum((s.get("grad_norm") or 0) > 0 for s in steps)
    harnesses = sorted({h for s in steps for h in s.get("harnesses", {})})
    return [f"- `{name}`: {len(steps)} steps so far, {moved} with a gradient.",
            *per_step(steps, harnesses, run["evals"])]


def num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _one(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
