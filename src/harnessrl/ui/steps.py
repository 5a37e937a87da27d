"""A training run's per-step curves for the viewer, from its `metrics.jsonl` (one line per
optimizer step, and one per eval pass: `train.async_grpo.loop.step_line`, `train.loop.StepLog`,
`train.runs.eval_during.EvalPass.line`).

Only the file's last `TAIL_BYTES` are read, so a long run costs one bounded read per poll.
A value a line does not have is absent from its series, never a made-up 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnessrl.train.common import METRICS_FILE

TAIL_BYTES = 4 << 20

# chart -> series -> the value in one step line (None: not recorded at that step)
Getter = Callable[[dict[str, Any]], Any]
CHARTS: dict[str, dict[str, Getter]] = {
    "reward": {"reward": lambda s: s.get("reward")},
    "groups with a reward spread": {"share": lambda s: s.get("groups_with_spread")},
    "advantage": {"mean |A|": lambda s: s.get("advantage_abs"),
                  "group range": lambda s: s.get("advantage_range")},
    "KL to the sampler": {"kl": lambda s: s.get("kl_to_sampler", s.get("kl")),
                          "trl kl": lambda s: (s.get("trl") or {}).get("kl")},
    "clipped and masked tokens": {"clip": lambda s: s.get("clip_fraction"),
                                  "IS masked": lambda s: s.get("is_masked_fraction"),
                                  "IS capped": lambda s: s.get("is_capped_fraction")},
    "replies cut or dropped": {"truncated": lambda s: s.get("truncated_share"),
                               "rejected": lambda s: s.get("rejected_share")},
    "groups and rollouts not trained": {
        "stale groups": lambda s: s.get("groups_stale_dropped"),
        "uniform groups": lambda s: s.get("groups_uniform"),
        "agent timeouts": lambda s: s.get("agent_timeouts"),
        "steps without gradient": lambda s: s.get("no_gradient")},
    "rows per step": {"rows": lambda s: s.get("step_rows", s.get("trained_sequences")),
                      "groups": lambda s: s.get("step_groups")},
    "trained tokens per step": {
        "tokens": lambda s: s.get("step_trained_tokens", s.get("trained_tokens"))},
}


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open("rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - TAIL_BYTES))
        data = f.read()
    if size > TAIL_BYTES:
        data = data.split(b"\n", 1)[-1]  # the first line may be cut
    out = []
    for text in data.decode("utf-8", "replace").splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            continue  # a line being written
        if isinstance(line, dict) and isinstance(line.get("step"), int | float):
            out.append(line)
    return out


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and value == value else None


def series(run_dir: Path) -> dict[str, Any]:
    """{"charts": [{"name", "series": [{"name", "points": [[step, value], ...]}]}],
    "eval": [{"harness", "points": [[step, pass@1, low, high], ...]}]}."""
    lines = _lines(run_dir / METRICS_FILE)
    steps = [line for line in lines if "eval" not in line]
    charts = [{"name": "pass rate per harness", "series": _per_harness(steps)}]
    for name, getters in CHARTS.items():
        found = [{"name": s, "points": points} for s, get in getters.items()
                 if (points := [[line["step"], v] for line in steps
                                if (v := _number(get(line))) is not None])]
        if found:
            charts.append({"name": name, "series": found})
    return {"steps": len(steps), "charts": [c for c in charts if c["series"]],
            "eval": _eval(lines)}


def _per_harness(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    points: dict[str, list[list[float]]] = {}
    for line in steps:
        for harness, figures in (line.get("harnesses") or {}).items():
            value = _number((figures or {}).get("pass_rate"))
            if value is not None:
                points.setdefault(harness, []).append([line["step"], value])
    return [{"name": h, "points": p} for h, p in sorted(points.items())]


def _eval(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    points: dict[str, list[list[float | None]]] = {}
    for line in lines:
        for harness, row in (line.get("eval") or {}).items():
            value = _number((row or {}).get("pass_rate"))
            if value is not None:
                points.setdefault(harness, []).append(
                    [line["step"], value, _number(row.get("ci_low")), _number(row.get("ci_high"))])
    return [{"harness": h, "points": p} for h, p in sorted(points.items())]
