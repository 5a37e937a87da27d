"""Did an RL arm learn the tasks it trained on? Each training task is sampled a group at a
time, and each visit's pass rate is the policy's on that task at that point of training.
The tasks are taken in turn, a seeded order per pass over them: a task's first visit falls
in training's first pass (its first steps), its last in the last pass. Read from the run's
trace store (eval rollouts and rollouts with no score left out) and kept as
STATE/progress/<unit>.visits.json, so the records (not the multi-GB run dir) give the
report again."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean

from seed_state import VISITS
from seed_stats import sign_test


def measure(run_dir: Path, group: int) -> dict[str, list[list[int]]]:
    """Per training task, each visit's [passed, scored] in order. A visit is a group: the
    rollouts numbered `group * v` to `group * v + group - 1` (each planned group takes the
    next `group` sample numbers of its task; the uniform groups that were redrawn count,
    as the policy's figures all the same)."""
    from harnessrl.store.reader import TraceReader

    with TraceReader(run_dir) as store:
        purpose = {r.key: r.metadata.get("purpose") for r in store.iter_rollouts()}
        outcomes = store.outcomes()
    visits: dict[str, dict[int, list[int]]] = {}
    for o in outcomes:
        if o.status != "done" or o.verifier_reward is None or purpose.get(o.rollout):
            continue
        passed_scored = visits.setdefault(o.task, {}).setdefault(o.sample // group, [0, 0])
        passed_scored[0] += o.verifier_reward >= 1.0
        passed_scored[1] += 1
    return {task: [v[n] for n in sorted(v)] for task, v in sorted(visits.items())}


def keep(root: Path, units: list[str], group: int) -> None:
    """The visits of every training unit in `units` whose run dir still has its store
    (read again only when the store changed since)."""
    for unit in units:
        run_dir = root / "work" / unit.replace("/", "__")
        path = root / "progress" / (unit.replace("/", "__") + VISITS)
        stores = [p for p in run_dir.glob("trace.db*") if p.is_file()]
        if stores and not (path.is_file() and path.stat().st_mtime
                           >= max(p.stat().st_mtime for p in stores)):
            found = measure(run_dir, group)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(found, indent=1))
            tmp.rename(path)


def section(root: Path) -> list[str]:
    """Per training run kept (and per run set aside with a replaced recipe): the pass
    rate at each task's first and last visit (tasks visited at least twice), the mean
    change per task with tasks up / down and the exact sign test, and each task's visits."""
    lines = ["| run | tasks | first visit | last visit | change per task (points) | tasks up "
             "/ down (sign p) |", "|---|---|---|---|---|---|"]
    detail = []
    folders = [(root / "progress", ""), *((f / "progress", f" (set aside: {f.name})")
                                          for f in sorted((root / "replaced").glob("*")))]
    for path, aside in ((p, aside) for folder, aside in folders
                        for p in sorted(folder.glob("*" + VISITS))):
        name = path.name.removesuffix(VISITS).replace("__", "/") + aside
        tasks = {t: v for t, v in json.loads(path.read_text()).items() if len(v) >= 2}
        if not tasks:
            continue
        first = [v[0][0] / v[0][1] for v in tasks.values()]
        last = [v[-1][0] / v[-1][1] for v in tasks.values()]
        change = [b - a for a, b in zip(first, last, strict=True)]
        up, down = sum(c > 0 for c in change), sum(c < 0 for c in change)
        lines.append(f"| `{name}` | {len(tasks)} | {fmean(first):.0%} | {fmean(last):.0%} | "
                     f"{100 * fmean(change):+.1f} | {up} / {down} ({sign_test(up, down):.2f}) |")
        detail.append(f"- `{name}`: " + "; ".join(
            f"{t} " + " ".join(f"{p}/{n}" for p, n in v) for t, v in tasks.items()))
    if not detail:
        return ["No training run's store kept yet."]
    return [*lines, "", "Each task's visits in order (passed/sampled):", "", *detail]

