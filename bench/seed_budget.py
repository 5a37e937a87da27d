"""bench/seed_table.py's budgets: what each phase's units depend on, kept once per state
dir (STATE/budget-<phase>.json) so that units measured under two budgets are never mixed;
the RL arms' recipe may change until one of them finishes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import arms
from seed_state import State

ARMS = ("base", "rl-one", "control", "rl-all", "rl-one-bonus", "sft")
RL_ARMS = ("rl-one", "control", "rl-all", "rl-one-bonus")
# Budget keys added after states were made, with the value those states ran with.
ADDED = {"truncated_turns": "mask", "format_penalty": 1.0, "rejected_turns": "mask"}
# The RL arms' recipe: what only their training (and so their evals) depends on. It may
# change while no RL arm has finished training in the state, or after, by
# --replace-recipe WHY: a recipe found wanting is replaced, never mixed (the runs' lines,
# and a finished arm's units with its evals, move to STATE/replaced/).
RL_RECIPE = ("steps", "group", "tasks_per_step", "lr", "max_staleness", "bonus",
             "bonus_budget", "eval_every", "curve_harnesses", "truncated_turns",
             "format_penalty", "rejected_turns")
# Settings that change what a phase's units measure: a state dir keeps one value of each.
SHARED = ("model", "task_seed", "train_tasks", "heldout", "max_tokens",
          "max_model_calls", "agent_timeout", "eval_temperature", "mode")
# (calibration's harnesses, tiers, tasks per tier and start only choose which cells run:
# each cell is the same, named by its start, split, tier and chunk)
BUDGET = {"calibrate": (*SHARED, "calib_samples", "calib_temperature"),
          "run": (*SHARED, "harnesses", "train_harness", "tiers", "heldout_sample", "seeds",
                  *RL_RECIPE, "sft_lr", "teacher_tasks", "start", "sft_steps",
                  "sft_rows_per_step", "eval_samples", "eval_temperatures", "select", "band",
                  "teacher_harnesses")}
# What the SFT start depends on, apart from the run (the sft phase builds the start that
# calibration and the run then share): its own file, so the run's budget can be chosen
# after calibrating the start.
SFT_KEYS = (*SHARED, "teacher_harnesses", "tiers", "seeds", "sft_lr", "teacher_tasks")


def budget_of(phase: str, args: argparse.Namespace) -> dict[str, Any]:
    if phase == "sft":
        return {**{k: getattr(args, k) for k in SFT_KEYS},
                "sft_budget": list(arms.sft_budget(args))}
    return {k: getattr(args, k) for k in BUDGET[phase]}


def check_budget(state: State, args: argparse.Namespace) -> None:
    """A state dir holds one budget per phase: a rerun with another is refused, naming what
    differs (STATE/budget-<phase>.json; the report states it). The run with an SFT start
    also checks the start's budget (budget-sft.json), which the sft phase writes."""
    phases = {"calibrate": ["calibrate"], "sft": ["sft"],
              "run": ["run", *(["sft"] if args.start == "sft" else [])]}[args.phase]
    units = state.all()
    trained = [n for n in units if n.startswith("train/") and n.split("/")[1] in RL_ARMS]
    replacing = args.replace_recipe
    recipe = RL_RECIPE if replacing or not trained else ()
    checked = {state.root / f"budget-{phase}.json": _check(
        state.root / f"budget-{phase}.json", budget_of(phase, args),
        recipe if phase == "run" else ()) for phase in phases}
    path = state.root / "budget-run.json"
    changed = _changed({**ADDED, **json.loads(path.read_text())}, checked[path], recipe) if (
        path in checked and path.is_file()) else []
    if changed:
        why = (f"the RL recipe changed after {', '.join(trained)} finished (--replace-recipe: "
               f"{replacing})" if trained else "the RL recipe changed before any RL arm "
               "finished") + f": {'; '.join(changed)}"
        finished = [n for n in units for t in trained
                    if n == t or _evaluates(n, t.split("/", 1)[1])]
        print(f"[seed_table] {why}; set aside in "
              f"{state.replace_runs(('train/', 'probe/'), why, finished)}")
    elif replacing:
        raise SystemExit("seed_table: --replace-recipe, but the RL recipe is the state's; "
                         "nothing to replace")
    for path, budget in checked.items():  # written once every phase's budget agrees
        path.write_text(json.dumps(budget, indent=1))


def _evaluates(unit: str, arm_seed: str) -> bool:
    """Whether `unit` is an eval chunk of `arm_seed` (`rl-one/s0`) at any temperature."""
    kind, _, rest = unit.partition("/")
    return kind.split("@")[0] == "eval" and rest.startswith(arm_seed + "/")


def _changed(saved: dict[str, Any], now: dict[str, Any], keys: tuple[str, ...] | None = None
             ) -> list[str]:
    """What differs (`keys`: among those only; seeds may be added, so never them)."""
    return [f"{k}: {saved.get(k)!r} then, {now[k]!r} now" for k in now
            if k != "seeds" and (keys is None or k in keys) and saved.get(k) != now[k]]


def _check(path: Path, now: dict[str, Any], mutable: tuple[str, ...] = ()) -> dict[str, Any]:
    saved = {**ADDED, **json.loads(path.read_text())} if path.is_file() else now
    if changed := _changed(saved, now, tuple(k for k in now if k not in mutable)):
        raise SystemExit(f"seed_table: {path.parent} was run with another budget "
                         f"({'; '.join(changed)}); use another --state")
    if "seeds" in now:
        now["seeds"] = sorted({*saved.get("seeds", []), *now["seeds"]})
    return now
