"""bench/seed_table.py's report sections for the three-seed experiment (issue 46): the
calibration per task with the power it gives, each arm against the start and against the
control pooled over the seeds (bootstrap interval, exact sign test), the tool-call bonus
on the calls the harness ran, the training diagnostics, and the curves' plot."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from statistics import fmean
from typing import Any

import seed_stats as st

Units = Mapping[str, Mapping[str, Any]]
TIER_ORDER = ("lookup", "count", "filter", "sum", "groupmax", "join")


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


# ------------------------------------------------------------------ calibration
def calibration(units: Units, band: list[float], group: int, samples: int) -> list[str]:
    """Per start label, split and harness: each tier's pass rate over its rollouts, its
    tasks in the band, and the share of groups of `group` expected to have spread (over
    the band's tasks, and over every task of the tier); then the detectable change."""
    cells = [k.split("/") for k in units if k.startswith("calib/") and k.count("/") == 5]
    if not cells:
        return ["No per-task calibration yet."]
    lines = [f"| start @ temperature | split | harness | tier | tasks | pass rate (rollouts) | "
             f"tasks in {band[0]:.0%}-{band[1]:.0%} | groups of {group} with spread: in band "
             "/ all |", "|---|---|---|---|---|---|---|---|"]
    power: list[str] = []
    for label, split, harness in sorted({(c[1], c[2], c[5]) for c in cells}):
        found = st.calibrated(units, label, split, harness)
        tiers = sorted({t.split("-")[0] for t in found},
                       key=lambda t: TIER_ORDER.index(t) if t in TIER_ORDER else 99)
        for tier in [*tiers, "all"]:
            mine = {t: r for t, r in found.items() if tier == "all" or t.startswith(tier)}
            scored = {t: a / n for t, (a, n) in mine.items() if n}
            inside = st.select(mine, band)
            passed, n = (sum(r[i] for r in mine.values()) for i in (0, 1))
            lines.append(
                f"| {label} | {split} | {harness} | {tier} | {len(mine)} | "
                f"{pct(passed / n if n else None)} ({passed}/{n}) | {len(inside)} | "
                f"{pct(st.expected_spread([scored[t] for t in inside], group))} / "
                f"{pct(st.expected_spread(scored.values(), group))} |")
        held = [a / n for t, (a, n) in found.items() if n and t in st.select(found, band)]
        if split == "heldout" and held:
            power.append(_power_line(label, harness, held, samples))
    return [*lines, "", *power] if power else lines


def _power_line(label: str, harness: str, rates: list[float], samples: int) -> str:
    sizes = [(len(rates), 1), (len(rates), 3), (40, 1), (40, 3)]
    mean = fmean(rates)
    return (f"- Detectable paired change (alpha 0.05, power 0.8, {samples} samples per "
            f"task), {label} in {harness}, start rates as calibrated on the {len(rates)} "
            f"held-out tasks in the band (mean {mean:.0%}): " + "; ".join(
                f"{n} tasks x {s} seed{'s' if s > 1 else ''} "
                f"{st.detectable_change((rates * (n // len(rates) + 1))[:n], samples, s):.1%}"
                for n, s in sizes) + ".")


# ------------------------------------------------------------------ pooled paired statistics
def differences(units: Units, kind: str, arm: str, reference: str, harness: str
                ) -> dict[str, list[float]]:
    """Per seed, the per-task paired differences of `arm` against `reference` (both
    evaluated in that seed, in `harness`, cells `KIND/ARM/sSEED/HARNESS`)."""
    found: dict[str, list[float]] = {}
    for key, cell in units.items():
        parts = key.split("/")
        if len(parts) == 4 and parts[0] == kind and parts[1] == arm and parts[3] == harness:
            other = units.get(f"{kind}/{reference}/{parts[2]}/{harness}")
            if other is not None:
                found[parts[2]] = st.paired_differences(cell["per_task"], other["per_task"])
    return found


def paired_cell(by_seed: dict[str, list[float]]) -> str:
    values = [d for seed in sorted(by_seed) for d in by_seed[seed]]
    if not values:
        return "not run"
    mean, low, high = st.bootstrap_mean(values)
    better, worse = st.signs(values)
    each = ", ".join(f"{s} {fmean(v) * 100:+.1f}" for s, v in sorted(by_seed.items()) if v)
    return (f"{mean * 100:+.1f} pts ({low * 100:+.1f} to {high * 100:+.1f}); tasks "
            f"+{better} -{worse}, sign p {st.sign_test(better, worse):.2g}; "
            f"n {len(values)} in {len(by_seed)} seed{'s' if len(by_seed) > 1 else ''} ({each})")


def pooled_paired(units: Units, kind: str, arms: list[str], harnesses: list[str],
                  reference: str) -> list[str]:
    lines = ["| arm | " + " | ".join(harnesses) + " |", "|---|" + "---|" * len(harnesses)]
    for arm in arms:
        if arm == reference:
            continue
        lines.append(f"| {arm} | " + " | ".join(
            paired_cell(differences(units, kind, arm, reference, h)) for h in harnesses) + " |")
    return lines


# ------------------------------------------------------------------ the tool-call bonus
def co_solved_calls(arm: Mapping[str, Any], other: Mapping[str, Any]) -> list[tuple[float, float]]:
    """Per task solved by both cells (at least one passing rollout each): the mean calls
    the harness ran over each cell's passing rollouts of it."""
    def calls(per_task: Mapping[str, Any]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for key, r in per_task.items():
            if r["status"] == "done" and r["passed"]:
                out.setdefault(key.split("#", 1)[0], []).append(r["tool_calls"])
        return out

    a, b = calls(arm), calls(other)
    return [(fmean(a[t]), fmean(b[t])) for t in sorted(a) if t in b]


def unparsed_share(cell: Mapping[str, Any]) -> float | None:
    rollouts = [r for r in cell["per_task"].values() if "answered_turns" in r]
    answered = sum(r["answered_turns"] for r in rollouts)
    return sum(r["unparsed_turns"] for r in rollouts) / answered if answered else None


def _over_seeds(values: list[float], spec: str) -> str:
    """The mean over seeds in `spec` (`+.0%`: a change, `.0%`: a share), with its 95% t
    interval over the seeds when there are two or more."""
    mean, low, high = st.interval_over_seeds(values)
    ci = f" ({low:{spec}} to {high:{spec}})" if low is not None and high is not None else ""
    return f"{mean:{spec}}{ci}, {len(values)} seed{'s' if len(values) > 1 else ''}"


def bonus(units: Units, kind: str, harnesses: list[str], arms: list[str]) -> list[str]:
    """rl-one-bonus against rl-one on the calls the harness ran (an unparsed call ran
    nothing and costs none), per seed and over the seeds (t interval); the unparsed-call
    share per answered turn per arm beside it."""
    lines = ["| harness | seed | co-solved tasks | rl-one calls / task | rl-one-bonus calls / "
             "task | change | counted from |", "|---|---|---|---|---|---|---|"]
    shares = ["| harness | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    for h in harnesses:
        changes = []
        for key, cell in sorted(units.items()):
            parts = key.split("/")
            if len(parts) != 4 or parts[:2] != [kind, "rl-one"] or parts[3] != h:
                continue
            other = units.get(f"{kind}/rl-one-bonus/{parts[2]}/{h}")
            pairs = co_solved_calls(cell["per_task"], other["per_task"]) if other else []
            if other is None or not pairs:
                continue
            a, b = fmean(p[0] for p in pairs), fmean(p[1] for p in pairs)
            changes += [(b - a) / a] if a else []
            sources = sorted({r.get("tool_call_source", "?") for c in (cell, other)
                              for r in c["per_task"].values()})
            lines.append(f"| {h} | {parts[2]} | {len(pairs)} | {a:.2f} | {b:.2f} | "
                         f"{(b - a) / a if a else 0:+.0%} | {', '.join(sources)} |")
        if changes:
            lines.append(f"| {h} | pooled over {len(changes)} seeds | | | | "
                         f"{_over_seeds(changes, '+.0%')} | |")
        row = []
        for arm in arms:
            per_seed = [s for k, c in units.items() if k.startswith(f"{kind}/{arm}/")
                        and k.endswith("/" + h) and (s := unparsed_share(c)) is not None]
            row.append(_over_seeds(per_seed, ".0%") if per_seed else "-")
        shares.append(f"| {h} | " + " | ".join(row) + " |")
    return [*lines, "", "Calls the harness ran (`Outcome.tool_calls`): `native`, the calls "
            "the dialect carried parsed; `harness`, the harness's own action record (a "
            "harness that parses actions from text); a call written as text and not parsed "
            "ran nothing and is not counted.", "",
            "Unparsed calls per answered turn (a reply with `tool_call>` in its "
            "text and no parsed call), mean over seeds (95% t interval over the seeds):", "",
            *shares]


def behaviour(units: Units, kind: str, harnesses: list[str], arms: list[str]) -> list[str]:
    """Per arm and harness, pooled over the seeds: model calls per rollout (the calls the
    proxy refused at the step cap included) and the rollouts stopped at the cap: how an
    arm's agent ends its work, beside whether the work passed."""
    lines = ["| arm | " + " | ".join(harnesses) + " |", "|---|" + "---|" * len(harnesses)]
    for arm in arms:
        row = []
        for h in harnesses:
            cells = [c for k, c in units.items() if k.startswith(f"{kind}/{arm}/")
                     and k.endswith("/" + h)]
            turns = [r["turns"] for c in cells for r in c["per_task"].values()
                     if r["status"] == "done" and "turns" in r]
            capped = sum(c.get("eval", {}).get("capped", 0) for c in cells)
            row.append(f"{fmean(turns):.1f} calls, {capped}/{len(turns)} capped"
                       if turns else "-")
        lines.append(f"| {arm} | " + " | ".join(row) + " |")
    return lines


# ------------------------------------------------------------------ training
def diagnosis(units: Units, arms: list[str]) -> list[str]:
    """Per RL arm, issue 45's step diagnostics averaged over its steps and seeds."""
    from arms import DIAGNOSED

    lines = ["| arm | seeds | steps | " + " | ".join(DIAGNOSED) + " |",
             "|---|---|---|" + "---|" * len(DIAGNOSED)]
    for arm in arms:
        runs = [u for k, u in units.items() if k.startswith(f"train/{arm}/")]
        steps = [s for u in runs for s in u.get("steps", [])]
        if not steps:
            continue
        cells = []
        for name in DIAGNOSED:
            values = [s[name] for s in steps if s.get(name) is not None]
            cells.append(f"{fmean(values):.3g}" if values else "-")
        lines.append(f"| {arm} | {len(runs)} | {len(steps)} | " + " | ".join(cells) + " |")
    return lines if len(lines) > 2 else ["No RL arm trained yet."]


def plot_curves(units: Units, arms: list[str], harness: str, path: Path,
                running: Units | None = None) -> bool:
    """Training reward per step and the eval-while-training pass rate in `harness` per
    step, per arm: each seed thin, the mean over seeds thick; `running` (training units
    not finished, as last kept) dashed. False: nothing to plot."""
    def of(found: Units) -> dict[str, list[Any]]:
        return {arm: [u for k, u in sorted(found.items()) if k.startswith(f"train/{arm}/")]
                for arm in arms}

    finished, unfinished = of(units), of(running or {})
    if not any(finished.values()) and not any(unfinished.values()):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for n, arm in enumerate(a for a in arms if finished[a] or unfinished[a]):
        for found, style, label in ((finished[arm], "-", arm),
                                    (unfinished[arm], "--", f"{arm} (running)")):
            if not found:
                continue
            _curve(left, [[(s["step"], r) for s in u.get("steps", [])
                           if (r := rollout_reward(s)) is not None] for u in found], f"C{n}",
                   label, style)
            _curve(right, [[(e["step"], e["eval"][harness]["passed"]
                             / e["eval"][harness]["rollouts"]) for e in u.get("evals", [])
                            if e["eval"].get(harness, {}).get("rollouts")] for u in found],
                   f"C{n}", label, style)
    left.set(xlabel="optimizer step", ylabel="training reward (mean per rollout*)")
    right.set(xlabel="optimizer step", ylabel=f"held-out pass rate in {harness}", ylim=(0, 1))
    left.legend(fontsize=7)
    fig.suptitle("per arm: each seed thin, mean over seeds thick, runs not finished dashed "
                 "(issue 46)\n* per row (TRL's mean) where a run's record holds no "
                 "per-rollout reward", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def rollout_reward(step: dict[str, Any]) -> float | None:
    """A step's mean reward per rollout, over its harnesses (a rollout's rows are not
    counted apart); for a step recorded before the per-harness reward was kept, the mean of
    its rows (TRL's), all there is."""
    rewards = [h["reward"] for h in step.get("harnesses", {}).values()
               if h.get("reward") is not None]
    return fmean(rewards) if rewards else step.get("reward")


def _curve(ax: Any, seeds: list[list[tuple[int, float]]], color: str, label: str,
           style: str = "-") -> None:
    for points in seeds:
        if points:
            ax.plot(*zip(*points, strict=True), color=color, alpha=0.3, linewidth=0.8,
                    linestyle=style)
    by_step: dict[int, list[float]] = {}
    for points in seeds:
        for step, value in points:
            by_step.setdefault(step, []).append(value)
    if by_step:
        steps = sorted(by_step)
        ax.plot(steps, [fmean(by_step[s]) for s in steps], color=color, linewidth=2,
                label=label, linestyle=style)
