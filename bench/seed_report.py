"""bench/seed_table.py's report: the .md and the .png from the units measured in a state
dir. Nothing is extrapolated: a cell not measured says so; several seeds are pooled (their
rollouts summed) and the pooling is said."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from statistics import fmean
from typing import Any

import seed_pooled
import seed_visits
from seed_runs import in_progress, num, replaced, rl_lines, runs
from seed_state import merged
from seed_stats import rates, sign_test

from harnessrl.rollout.evaluate import wilson

ARM_TEXT = {
    "base": "base weights",
    "rl-one": "RL in one harness",
    "rl-all": "RL in all the eval harnesses at once (one per group)",
    "rl-one-bonus": "RL in one harness + the tool-call bonus",
    "sft": "SFT on teacher rollouts",
}
REFERENCE = """The reference's figures (LFM2.5-2.6B, 1,000 data-analysis tasks, as issue 40
quotes them): training in one harness helped mostly there (OpenCode 34% -> 58%); training in
four at once helped in all four (42% -> 54%); a small bonus for fewer tool calls cut calls by
31% on tasks already solved; SFT on 3,189 rollouts of a bigger model plateaued below both RL
runs; a third party found little transfer to harnesses not trained in."""


def _load(root: Path, kind: str) -> dict[str, dict[str, Any]]:
    folder = root / kind
    if not folder.is_dir():
        return {}
    return {p.stem.replace("__", "/"): json.loads(p.read_text())
            for p in sorted(folder.glob("*.json"))}


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def pooled(cells: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Several cells (seeds) of one arm x harness as one: rollouts and passes summed."""
    if not cells:
        return None
    tasks = [t for c in cells for t in c["per_task"].values()]
    scored = [t for t in tasks if t["status"] == "done"]
    passed = [t for t in scored if t["passed"]]
    low, high = wilson(len(passed), len(scored)) if scored else (None, None)
    return {"n": len(scored), "passed": len(passed),
            "rate": len(passed) / len(scored) if scored else None, "low": low, "high": high,
            "calls": fmean([t["tool_calls"] for t in passed]) if passed else None,
            "infra": len(tasks) - len(scored), "seeds": len(cells),
            "capped": sum(c["eval"].get("capped", 0) for c in cells)}


def cell_text(p: dict[str, Any] | None) -> str:
    if p is None:
        return "not run"
    if p["rate"] is None:
        return f"no scored rollout ({p['infra']} infra errors)"
    infra = f", {p['infra']} infra" if p["infra"] else ""
    return (f"{p['rate']:.0%} ({p['low']:.0%}-{p['high']:.0%}) {p['passed']}/{p['n']}"
            f"{infra}")


def calls_text(p: dict[str, Any] | None) -> str:
    return "-" if p is None or p["calls"] is None else f"{p['calls']:.1f}"


def calibration(units: dict[str, Any], harnesses: list[str]) -> list[str]:
    # issue 40's cells, calib/TIER/HARNESS (issue 46's per-task ones are seed_pooled's)
    cells = {k.split("/", 1)[1]: v for k, v in units.items()
             if k.startswith("calib/") and k.count("/") == 2}
    if not cells:
        return ["Not run (see the per-task calibration)."]
    harnesses = sorted({k.split("/")[1] for k in cells}, key=lambda h: (h not in harnesses, h))
    order = ("lookup", "count", "filter", "sum", "groupmax", "join")
    tiers = sorted({k.split("/")[0] for k in cells},
                   key=lambda t: order.index(t) if t in order else len(order))
    lines = ["| tier | " + " | ".join(harnesses) + " |", "|---|" + "---|" * len(harnesses)]
    good = []
    for tier in tiers:
        row = [pooled([cells[f"{tier}/{h}"]]) if f"{tier}/{h}" in cells else None
               for h in harnesses]
        lines.append(f"| {tier} | " + " | ".join(cell_text(p) for p in row) + " |")
        if sum(1 for p in row if p and p["rate"] is not None and 0.05 <= p["rate"] <= 0.5) >= 2:
            good.append(tier)
    prompts = {h: max((c.get("prompt_tokens_max") or 0 for k, c in cells.items()
                       if k.endswith("/" + h)), default=0) for h in harnesses}
    errors = {h: _summed([c.get("turn_errors", {}) for k, c in cells.items()
                          if k.endswith("/" + h)]) for h in harnesses}
    lines += ["", "Model calls that failed or were refused, per harness (kind: count): "
              + "; ".join(f"{h} {e or 'none'}" for h, e in errors.items()) + "."]
    lines += ["", "Longest prompt seen per harness (tokens, of SmolLM2's 8192): "
              + ", ".join(f"{h} {n or '-'}" for h, n in prompts.items()) + ".", "",
              "Tiers where the base model passes 5-50% in at least two harnesses: "
              + (", ".join(good) if good else "**none**") + "."]
    return lines


def _summed(counts: list[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for count in counts:
        for kind, n in count.items():
            total[kind] = total.get(kind, 0) + n
    return total


def table(units: dict[str, Any], arms: list[str], harnesses: list[str]
          ) -> tuple[list[str], dict[str, dict[str, Any] | None]]:
    stats: dict[str, dict[str, Any] | None] = {}
    lines = ["| arm | " + " | ".join(f"{h}: pass@1 (95% CI) passed/n | {h}: tool calls / "
                                     "solved" for h in harnesses) + " |",
             "|---|" + "---|---|" * len(harnesses)]
    for arm in arms:
        cells = []
        for h in harnesses:
            found = [v for k, v in units.items()
                     if k.startswith(f"eval/{arm}/") and k.endswith("/" + h)]
            stats[f"{arm}/{h}"] = p = pooled(found)
            cells += [cell_text(p), calls_text(p)]
        lines.append(f"| {ARM_TEXT.get(arm, arm)} | " + " | ".join(cells) + " |")
    return lines, stats


def co_solved(units: dict[str, Any], harnesses: list[str]) -> list[str]:
    """Tool calls per task solved by both rl-one and rl-one-bonus (same tasks, same seed),
    with the tasks whose calls went down and up, and the turns beside: a bonus on tool
    calls alone can also be met with turns that call no tool."""
    lines = ["| harness | co-solved tasks | rl-one calls / task | rl-one-bonus calls / task "
             "| change | tasks fewer / more calls | rl-one turns / task | rl-one-bonus turns "
             "/ task |", "|---|---|---|---|---|---|---|---|"]
    for h in harnesses:
        pairs = []
        for key, cell in units.items():
            if key.startswith("eval/rl-one/") and key.endswith("/" + h):
                other = units.get(key.replace("eval/rl-one/", "eval/rl-one-bonus/", 1))
                if other is None:
                    continue
                solved = [_solved(cell["per_task"]), _solved(other["per_task"])]
                pairs += [(solved[0][t], solved[1][t]) for t in sorted(solved[0])
                          if t in solved[1]]
        if not pairs:
            lines.append(f"| {h} | 0 | - | - | - | - | - | - |")
            continue
        a, b = (fmean(p[i]["tool_calls"] for p in pairs) for i in (0, 1))
        ta, tb = (fmean(p[i]["turns"] for p in pairs) for i in (0, 1))
        fewer = sum(y["tool_calls"] < x["tool_calls"] for x, y in pairs)
        more = sum(y["tool_calls"] > x["tool_calls"] for x, y in pairs)
        change = f"{(b - a) / a:+.0%}" if a else "-"
        lines.append(f"| {h} | {len(pairs)} | {a:.2f} | {b:.2f} | {change} | {fewer} / {more} "
                     f"| {ta:.2f} | {tb:.2f} |")
    return lines


def _solved(per_task: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per task with a passing rollout: the mean tool calls and turns of its passing
    rollouts (one rollout per task, or several: keys `task#sample`)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for key, t in per_task.items():
        if t["status"] == "done" and t["passed"]:
            found.setdefault(key.split("#", 1)[0], []).append(t)
    return {task: {"tool_calls": fmean(r["tool_calls"] for r in rs),
                   "turns": fmean(r["turns"] for r in rs)} for task, rs in found.items()}


def paired(units: dict[str, Any], arms: list[str], harnesses: list[str], start: str
           ) -> list[str]:
    """Each arm against its start, task by task (same tasks, same seed): tasks gained and
    lost (pooled, then per seed when there are several), the exact two-sided sign test on
    the pooled counts, and what was solved per tier (a task's tier is its id's prefix).
    Sharper than two intervals side by side: the noise of the shared tasks cancels."""
    lines = ["| arm | " + " | ".join(harnesses) + " |", "|---|" + "---|" * len(harnesses)]
    for arm in arms:
        cells = []
        for h in harnesses:
            seeds: dict[str, list[int]] = {}
            tiers: dict[str, list[int]] = {}
            for key, cell in units.items():
                if not (key.startswith(f"eval/{arm}/") and key.endswith("/" + h)):
                    continue
                other = units.get(key.replace(f"eval/{arm}/", f"eval/{start}/", 1), {})
                changed = seeds.setdefault(key.split("/")[2], [0, 0])
                mine, theirs = rates(cell["per_task"]), rates(other.get("per_task", {}))
                for task, (passed, n) in mine.items():
                    solved = tiers.setdefault(task.split("-")[0], [0, 0])
                    solved[0] += passed
                    solved[1] += n
                    if n and theirs.get(task, (0, 0))[1]:  # a task's rate, over its samples
                        a, b = passed / n, theirs[task][0] / theirs[task][1]
                        changed[0] += a > b
                        changed[1] += b > a
            cells.append(_paired_cell(seeds, tiers, arm == start))
        lines.append(f"| {ARM_TEXT.get(arm, arm)} | " + " | ".join(cells) + " |")
    return lines


def _paired_cell(seeds: dict[str, list[int]], tiers: dict[str, list[int]], is_start: bool
                 ) -> str:
    if not tiers:
        return "not run"
    by_tier = ", ".join(f"{tier} {a}/{n}" for tier, (a, n) in sorted(tiers.items()))
    if is_start:
        return by_tier
    gained, lost = (sum(c[i] for c in seeds.values()) for i in (0, 1))
    each = (" (" + ", ".join(f"{s} +{g} -{x}" for s, (g, x) in sorted(seeds.items())) + ")"
            if len(seeds) > 1 else "")
    return f"+{gained} -{lost}{each}, sign test p {sign_test(gained, lost):.2g}; {by_tier}"


def training(units: dict[str, Any]) -> list[str]:
    lines = []
    for key, u in units.items():
        if key.startswith(("train/", "probe/")):
            lines += rl_lines(key, u)
        elif key.startswith("teacher/"):
            lines.append(f"- `{key}`: {u['solved']}/{u['rollouts']} teacher rollouts solved "
                         f"({u['infra_errors']} infra errors), {u['seconds']:.0f} s.")
        elif key.startswith("sft/"):
            lines.append(
                f"- `{key}`: {u['rows']} rows ({u['rows_per_harness']}), re-tokenized by the "
                f"student's template (the teacher sampled no student ids), loss on the "
                f"assistant turns only ({u['trained_tokens']} tokens); {u['steps']} steps x "
                f"{u['rows_per_step']} rows{_lr(u)}; loss {num(u['loss_first'])} -> "
                f"{num(u['loss_last'])}; {u['seconds'] / 60:.1f} min." + _rebuilt(u))
    return lines or ["Nothing trained yet."]


def _rebuilt(unit: dict[str, Any]) -> str:
    """An SFT start built again on another machine, against its first build."""
    if (first := unit.get("first_build")) is None:
        return ""
    same, diff = unit.get("same_as_first_build"), first["max_loss_difference"]
    return (f" Built again on another machine ({unit['finished']}) against its first build "
            f"({first['finished']}: {first['rows']} rows, {first['trained_tokens']} trained "
            f"tokens): per-step losses differ by up to "
            f"{'-' if diff is None else f'{diff:.4f}'}"
            + (", the same model." if same else
               "; not the same model, so what was measured on the first build is set aside "
               "and measured again."))


def _lr(unit: dict[str, Any]) -> str:
    return f" at lr {unit['lr']:g}" if unit.get("lr") else ""


def wall(root: Path, units: dict[str, Any]) -> str:
    events = [json.loads(x) for x in (root / "events.jsonl").read_text().splitlines()
              ] if (root / "events.jsonl").is_file() else []
    if not units:
        return "No unit finished yet."
    work = sum(u["seconds"] - u.get("lock_wait", 0) for u in units.values())
    starts = sum(e.get("startup", 0) for e in events if e["kind"] == "served")
    first = min(u["started"] for u in units.values())
    last = max(u["finished"] for u in units.values())
    return (f"Wall time: {first} to {last} UTC (with the lock waits while others' work ran); "
            f"the units' own work {work / 3600:.2f} h plus {starts / 60:.1f} min of vLLM "
            f"start-ups, on {os.cpu_count()} shared cores.")


def notes(root: Path) -> list[str]:
    """STATE/notes.md, written by hand: what was seen in the logs (kept apart from figures)."""
    path = root / "notes.md"
    return ["## Notes from the logs", "", path.read_text().strip(), ""] if path.is_file() else []


def start_note(budget: dict[str, Any]) -> str:
    if not budget:
        return "The arms have not been run yet."
    if budget.get("start") == "sft":
        sft_steps = budget.get("sft_steps") or budget["steps"]
        return (f"Start: **the SFT model** (the base model passed no calibrated tier at 5%, "
                f"the issue's fallback): the sft arm is that model ({sft_steps} SFT "
                f"steps); every RL arm is {budget['steps']} GRPO steps on top of it; the base "
                "arm is the untrained weights.")
    return f"Start: the base weights; every trained arm has {budget['steps']} optimizer steps."


def write(args: argparse.Namespace, root: Path) -> str:
    measured, failed = _load(root, "units"), _load(root, "failed")
    units, partial = merged(measured)
    budgets = {phase: read_json(root / f"budget-{phase}.json")
               for phase in ("calibrate", "sft", "run")}
    # each phase's own harnesses (calibration may try more than the run keeps)
    harnesses = list(budgets["run"].get("harnesses") or args.harnesses)
    calibrated = list(dict.fromkeys(k.split("/")[2] for k in units
                                    if k.startswith("calib/") and k.count("/") == 2))
    arms = list(args.arms)
    start = "sft" if budgets["run"].get("start") == "sft" else "base"
    lines_table, stats = table(units, arms, harnesses)
    commands = (root / "commands.txt").read_text().strip().splitlines() if (
        root / "commands.txt").is_file() else []
    evals = [k for k in units if k.startswith("eval/")]
    expected = len(arms) * len(harnesses) * len(budgets["run"].get("seeds") or [0])
    status = "complete" if evals and len(evals) >= expected else "partial"
    text = ["# The seed's table in kind: SmolLM2-135M through harnessrl (issue 40)", "",
            f"Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} from the state "
            f"dir `{root}` by `bench/seed_table.py`; **{status}**: {len(evals)} of {expected} "
            "arm x harness cells measured. Every figure below is as measured; a cell not "
            "run says so.", "",
            *[f"- `{cell}`: {n} of {total} chunks measured (in the report once all are)"
              for cell, (n, total) in sorted(partial.items())],
            *([""] if partial else []), "## Budget as run", "",
            *[f"- `{c}`" for c in commands],
            *[f"- {phase}: `{json.dumps(b)}`" for phase, b in budgets.items() if b],
            "", wall(root, measured), "", start_note(budgets["run"]), "",
            "## Calibration: the base model's pass rate per tier and harness", "",
            *calibration(units, calibrated), "",
            "## pass@1 on the held-out sample, per arm and harness", "",
            *lines_table, "",
            f"Pass@1: {budgets['run'].get('eval_samples') or 1} rollout(s) per task at the "
            "eval temperature, each counted; 95% Wilson interval; "
            "infrastructure errors counted apart and out of every rate; tool calls per solved "
            "task over the solved ones. Seeds are pooled: n counts the rollouts of every "
            "seed run, so an arm run for fewer seeds has a smaller n.", "",
            f"## Against the start ({start}), task by task", "",
            *paired(units, arms, harnesses, start), "",
            "Tasks gained (failed by the start, passed by the arm) and lost, on the same "
            "held-out tasks and seed, with the exact sign test on those; then solved per "
            "tier.", "",
            "## Tool-call bonus: tool calls per co-solved task", "", *co_solved(units, harnesses),
            "", *experiment(args, root, units, budgets, arms, harnesses, start),
            "## Training and SFT", "", *training(units), "",
            *(["## Training runs not finished (as last kept)", "", *running, ""]
              if (running := in_progress(root, measured)) else []),
            *(["## Runs set aside (a recipe replaced, or a run lost and started again)", "",
               *gone]
              if (gone := replaced(root)) else []), *notes(root),
            "## Not done / failed", "",
            *([f"- `{k}`: {v['error'].splitlines()[0]}" for k, v in failed.items()]
              or ["- nothing failed"]), "", "## The reference, beside", "", REFERENCE, ""]
    body = "\n".join(text)
    args.out.write_text(body)
    plot(stats, arms, harnesses, args.plot)
    return body


def experiment(args: argparse.Namespace, root: Path, units: dict[str, Any],
               budgets: dict[str, Any], arms: list[str], harnesses: list[str], start: str
               ) -> list[str]:
    """Issue 46's sections: the per-task calibration with the power it gives, the arms
    against the start and the control pooled over the seeds per eval temperature, the
    bonus on executed calls, the diagnosis per arm, and the curves (a PNG beside)."""
    run = budgets["run"]
    band, group = run.get("band") or args.band, run.get("group") or args.group
    samples = budgets["calibrate"].get("calib_samples") or args.calib_samples
    lines = ["## Per-task calibration at the training temperature (issue 46)", "",
             *seed_pooled.calibration(units, band, group, samples), ""]
    temperatures = run.get("eval_temperatures") or [run.get("eval_temperature", 0.6)]
    for n, temperature in enumerate(temperatures):
        kind = "eval" if n == 0 else f"eval@{temperature:g}"
        if not any(k.startswith(kind + "/") for k in units):
            continue
        for reference in (start, "control"):
            lines += [f"## Against the {reference}, pooled over the seeds, at temperature "
                      f"{temperature:g}", "",
                      *seed_pooled.pooled_paired(units, kind, arms, harnesses, reference), "",
                      "Per task and seed, the arm's pass rate minus the reference's (points), "
                      "mean with a 95% bootstrap interval over those units; tasks better / "
                      "worse with the exact sign test; each seed's mean in brackets.", ""]
        lines += [f"## The tool-call bonus on the calls the harness ran, at temperature "
                  f"{temperature:g}", "", *seed_pooled.bonus(units, kind, harnesses, arms), "",
                  f"Model calls per rollout and rollouts stopped at the step cap, at "
                  f"temperature {temperature:g}:", "",
                  *seed_pooled.behaviour(units, kind, harnesses, arms), ""]
    curves = args.out.with_name(args.out.stem + "_curves.png")
    # every training run's lines as kept, read again (a unit's own may predate a reading)
    kept = runs(root / "progress")
    trained = {k: {**u, **kept[k]} if k in kept else u for k, u in units.items()}
    if seed_pooled.plot_curves(trained, arms, run.get("train_harness") or harnesses[0], curves,
                               {k: v for k, v in kept.items() if k not in units}):
        lines += [f"![training reward and eval curves per arm]({curves.name})", ""]
    return [*lines, "## Diagnosis per RL arm (issue 45's step diagnostics)", "",
            *seed_pooled.diagnosis(units, arms), "",
            "## The training tasks, visit by visit: did an arm learn what it trained on?", "",
            *seed_visits.section(root), ""]


def plot(stats: dict[str, dict[str, Any] | None], arms: list[str], harnesses: list[str],
         path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [a for a in arms if any(stats.get(f"{a}/{h}") for h in harnesses)]
    if not shown:
        return
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(harnesses)), 4))
    width = 0.8 / len(shown)
    for i, arm in enumerate(shown):
        xs, ys, errs = [], [], [[], []]
        for j, h in enumerate(harnesses):
            p = stats.get(f"{arm}/{h}")
            if p is None or p["rate"] is None:
                continue
            xs.append(j + (i - (len(shown) - 1) / 2) * width)
            ys.append(p["rate"])
            errs[0].append(p["rate"] - p["low"])
            errs[1].append(p["high"] - p["rate"])
        ax.bar(xs, ys, width=width, yerr=errs, capsize=3, label=ARM_TEXT.get(arm, arm))
    ax.set_xticks(range(len(harnesses)), harnesses)
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass@1 on held-out tasks (95% CI)")
    ax.set_title("SmolLM2-135M per arm and harness (issue 40)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
