#!/usr/bin/env python3
"""The seed's experiment in kind (issue 40), on a CPU: does training SmolLM2-135M in one
harness, or in several, help in each; what a tool-call bonus and SFT do. Figures, not a test.

Arms, each from the same weights with the same seeds and budget (optimizer steps x rows per
step), each evaluated on the same held-out sample of generated data-analysis tasks in every
eval harness (pass@1 with a Wilson 95% interval, tool calls per solved task):

    base          the starting weights, untrained
    rl-one        GRPO in one harness (--train-harness)
    rl-all        GRPO in every eval harness at once, one harness per group
    rl-one-bonus  rl-one with the reference's tool-call bonus r*(1 + w*B/(B + calls))
    sft           SFT on teacher rollouts: each task's reference program driven through the
                  harnesses by a scripted policy (text, no student ids: re-tokenized by the
                  student's template, flagged so), the same number of optimizer steps

Phases: `calibrate` (the base model's pass rate per tier per harness on a small sample, to
pick the tiers where it passes 5-50%), `sft` (only the run's SFT model: the teacher's
rollouts and the training, no eval; with --sft-nice its training runs outside the heavy
lock at nice 19), `run` (the arms), `report` (the .md and .png from what is measured).
Every unit of work (a calibration cell, a teacher run, an arm's training, an arm x
harness eval) writes its result to STATE/units/*.json and is skipped when run again,
so a rerun after a kill goes on; an RL arm killed mid-training goes on from its newest whole
checkpoint (`harnessrl train --resume`). Heavy units take /tmp/harnessrl-heavy.lock (flock)
for their own duration only. The defaults are the issue's full ask; the .md says the budget
that was run and its wall time. `--record DIR` copies the small records (no weights) to a
folder in the repository whenever the report is written (after each eval, at the end), so
the figures outlive the machine.

    python bench/seed_table.py calibrate --calib-per-tier 10
    python bench/seed_table.py run --tiers lookup,count --heldout-sample 30 --steps 8
    python bench/seed_table.py report
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import shutil
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
import arms
import seed_report
from seed_state import WAITED, State, event, heavy, run_child, unit

ARMS = ("base", "rl-one", "rl-all", "rl-one-bonus", "sft")
RL_ARMS = ("rl-one", "rl-all", "rl-one-bonus")
HARNESSRL = str(Path(sys.executable).with_name("harnessrl"))
# Settings that change what a phase's units measure: a state dir keeps one value of each.
SHARED = ("model", "task_seed", "train_tasks", "heldout", "max_tokens",
          "max_model_calls", "agent_timeout", "eval_temperature", "mode")
# (calibration's harnesses and tiers only choose which cells run: each cell is the same)
BUDGET = {"calibrate": (*SHARED, "calib_per_tier"),
          "run": (*SHARED, "harnesses", "train_harness", "tiers", "heldout_sample", "seeds",
                  "steps", "group", "tasks_per_step", "lr", "max_staleness", "bonus",
                  "bonus_budget", "sft_lr", "teacher_tasks", "start", "eval_every",
                  "sft_steps", "sft_rows_per_step")}
BUDGET["sft"] = BUDGET["run"]  # the sft phase builds the run's start: one budget


def check_budget(state: State, args: argparse.Namespace) -> None:
    """A state dir holds one budget per phase: a rerun with another is refused, naming what
    differs (STATE/budget-<phase>.json; the report states it)."""
    keys = BUDGET[args.phase]
    path = state.root / f"budget-{'run' if args.phase == 'sft' else args.phase}.json"
    now = {k: getattr(args, k) for k in keys}
    saved = json.loads(path.read_text()) if path.is_file() else now
    # Seeds may be added (`--seeds 1` after `--seeds 0`): each seed's units are its own.
    if changed := [f"{k}: {saved.get(k)!r} then, {now[k]!r} now" for k in keys
                   if k != "seeds" and saved.get(k) != now[k]]:
        raise SystemExit(f"seed_table: {state.root} was run with another budget "
                         f"({'; '.join(changed)}); use another --state")
    if "seeds" in now:
        now["seeds"] = sorted({*saved.get("seeds", []), *now["seeds"]})
    path.write_text(json.dumps(now, indent=1))


# ------------------------------------------------------------------ tasks
def generated(state: State, args: argparse.Namespace, tiers: list[str], count: tuple[int, int]
              ) -> Path:
    """The generated task set (tablegen) for these tiers, written once under STATE/tasks."""
    out = state.root / "tasks" / f"seed{args.task_seed}-{'-'.join(tiers)}-{count[0]}-{count[1]}"
    if (out / "manifest.json").is_file():
        return out
    from harnessrl.rollout import tablegen

    # The generator's keyword for the held-out count (heldout / held_out), whichever it has.
    held = next(p for p in ("heldout", "held_out")
                if p in inspect.signature(tablegen.generate_sets).parameters)
    sets = tablegen.generate_sets(seed=args.task_seed, train=count[0], tiers=tiers,
                                  **{held: count[1]})
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    tablegen.write_sets(sets, partial)
    partial.rename(out)
    return out


def split_dir(tasks: Path, name: str) -> Path:
    names = ("train",) if name == "train" else ("heldout", "held_out")
    found = [tasks / n for n in names if (tasks / n).is_dir()]
    if not found:
        raise FileNotFoundError(f"{tasks}: no {' or '.join(names)} directory")
    return found[0]


def sample(source: Path, ids: list[str], out: Path) -> Path:
    """A task directory holding copies of `ids` from `source` (made once)."""
    if out.is_dir():
        return out
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for task_id in ids:
        shutil.copytree(source / task_id, partial / task_id)
    partial.rename(out)
    return out


def tier_ids(directory: Path) -> dict[str, list[str]]:
    from harnessrl.rollout.tasks import load_tasks

    by_tier: dict[str, list[str]] = {}
    for task in load_tasks(directory):
        by_tier.setdefault(task.difficulty or "-", []).append(task.id)
    return {tier: sorted(ids) for tier, ids in by_tier.items()}


def seeded(ids: list[str], k: int, seed: str) -> list[str]:
    """A fixed seeded subset of k ids (all when k is 0 or at least their number)."""
    if not k or k >= len(ids):
        return sorted(ids)
    return sorted(random.Random(seed).sample(sorted(ids), k))


# ------------------------------------------------------------------ evaluation
def eval_cell(args: argparse.Namespace, state: State, name: str, url: str, harness: str,
              tasks: Path) -> dict[str, Any]:
    """`harnessrl eval` of the served model in one harness on a task dir; its figures and
    each task's outcome. An interrupted cell is redone whole (its run dir removed)."""
    run_dir = state.work(name)
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [HARNESSRL, "eval", "--harness", harness, "--tasks", str(tasks), "-k", "1",
               "--engine-url", url, "--run-dir", str(run_dir),
               "--concurrency", str(args.concurrency), "--retries", "1",
               "--agent-timeout", str(args.agent_timeout), "--max-tokens", str(args.max_tokens),
               "--temperature", str(args.eval_temperature),
               "--max-model-calls", str(args.max_model_calls)]
    with state.log(name).open("w") as log:
        code = run_child(command, log)
    return {"returncode": code, **figures(run_dir)}


def figures(run_dir: Path) -> dict[str, Any]:
    from harnessrl.proxy.store import TraceReader
    from harnessrl.rollout.evaluate import evaluate

    with TraceReader(run_dir) as store:
        outcomes = store.outcomes()
        if not outcomes:
            raise RuntimeError(f"{run_dir}: the eval recorded no outcome")
        prompts, errors = [], {}
        for outcome in outcomes:
            for turn in store.turns(outcome.rollout):
                if turn.status != "ok":
                    errors[turn.error_kind or turn.status] = errors.get(
                        turn.error_kind or turn.status, 0) + 1
                elif turn.completion and turn.completion.tokens.prompt_ids:
                    prompts.append(len(turn.completion.tokens.prompt_ids))
    [row] = evaluate(outcomes, 1)
    per_task = {o.task: {"status": o.status, "passed": (o.verifier_reward or 0) >= 1,
                         "tool_calls": o.tool_calls, "turns": o.turns} for o in outcomes}
    return {"eval": asdict(row), "per_task": per_task, "turn_errors": errors,
            "prompt_tokens_max": max(prompts, default=None),
            "prompt_tokens_first": min(prompts, default=None)}


def served_evals(args: argparse.Namespace, state: State, model: Path, label: str,
                 cells: list[tuple[str, str, Path]]) -> None:
    """One vLLM serving `model` for every pending (unit, harness, tasks) cell."""
    pending = [c for c in cells if state.done(c[0]) is None]
    if not pending:
        return
    from harnessrl.proxy.engines.vllm_server import VLLMServer

    with heavy(args.lock, f"evals of {label}"):
        started = time.monotonic()
        with VLLMServer(model=str(model), served_name="policy", dtype="float32",
                        max_model_len=8192,
                        log_path=state.root / "logs" / f"vllm-{label}.log") as server:
            event(state, "served", label=label, model=str(model),
                  lock_wait=round(WAITED[-1], 1) if args.lock else 0.0,
                  startup=round(time.monotonic() - started, 1))
            for name, harness, tasks in pending:
                unit(state, name, lambda n=name, h=harness, t=tasks: eval_cell(
                    args, state, n, server.url, h, t))
                report(args, state)  # the .md as measured so far


# ------------------------------------------------------------------ the phases
def base_model(args: argparse.Namespace) -> Path:
    from rich.console import Console

    from harnessrl.train.loop import resolve_model

    return resolve_model(args.model, Console(stderr=True))


def calibrate(args: argparse.Namespace, state: State) -> None:
    from harnessrl.rollout.tablegen import TIERS

    # every tier generated, whichever are calibrated: a cell's tasks never depend on the others
    tasks = generated(state, args, list(TIERS), (args.train_tasks, args.heldout))
    by_tier = tier_ids(split_dir(tasks, "train"))
    cells = []
    for tier in args.calib_tiers:
        ids = seeded(by_tier.get(tier, []), args.calib_per_tier, f"{args.task_seed}:calib:{tier}")
        where = sample(split_dir(tasks, "train"), ids, state.root / "tasks" / f"calib-{tier}")
        cells += [(f"calib/{tier}/{h}", h, where) for h in args.harnesses]
    served_evals(args, state, base_model(args), "base-calibration", cells)


def sft_only(args: argparse.Namespace, state: State) -> None:
    tasks = generated(state, args, args.tiers, (args.train_tasks, args.heldout))
    train, base = split_dir(tasks, "train"), base_model(args)
    for seed in args.seeds:
        arms.sft_model(args, state, train, seed, base)


def run(args: argparse.Namespace, state: State) -> None:
    tasks = generated(state, args, args.tiers, (args.train_tasks, args.heldout))
    held = split_dir(tasks, "heldout")
    ids = seeded(sorted(p.name for p in held.iterdir() if p.is_dir()), args.heldout_sample,
                 f"{args.task_seed}:heldout")
    heldout = sample(held, ids, state.root / "tasks" / f"heldout-{len(ids)}-{tasks.name}")
    args.heldout_dir = heldout
    train, base = split_dir(tasks, "train"), base_model(args)
    for seed in args.seeds:
        start = arms.start_model(args, state, train, seed, base)
        for arm in args.arms:
            model = base if arm == "base" else arms.train_arm(args, state, train, seed, arm,
                                                              start, base)
            if model is None:
                continue  # its training failed: recorded in STATE/failed, retried next run
            cells = [(f"eval/{arm}/s{seed}/{h}", h, heldout) for h in args.harnesses]
            served_evals(args, state, model, f"{arm}-s{seed}", cells)
            report(args, state)


# ------------------------------------------------------------------ the command line
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("phase", choices=["calibrate", "sft", "run", "report"])
    p.add_argument("--state", type=Path, default=Path("runs/seed_table"))
    p.add_argument("--out", type=Path, default=Path("bench/seed_table.md"))
    p.add_argument("--plot", type=Path, default=Path("bench/seed_table.png"))
    p.add_argument("--record", type=Path, default=None, help="copy the state's small records "
                   "(units, budgets, commands, notes) here with each report, to commit")
    p.add_argument("--lock", default="/tmp/harnessrl-heavy.lock", help="'' for none")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--harnesses", default="mini-swe-agent,aider,pi",
                   help="eval harnesses (rl-all trains in all of them)")
    p.add_argument("--train-harness", default=None, help="rl-one's (default: the first)")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--tiers", default="lookup,count,filter,sum,groupmax,join")
    p.add_argument("--calib-tiers", default="lookup,count,filter,sum,groupmax,join")
    p.add_argument("--calib-per-tier", type=int, default=20)
    p.add_argument("--task-seed", type=int, default=0)
    p.add_argument("--train-tasks", type=int, default=1000)
    p.add_argument("--heldout", type=int, default=250)
    p.add_argument("--heldout-sample", type=int, default=0, help="K: a fixed seeded subset "
                   "of the held-out set (0: all of it)")
    p.add_argument("--seeds", default="0", help="comma-separated; every arm once per seed")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps per arm")
    p.add_argument("--group", type=int, default=8, help="rollouts per GRPO group")
    p.add_argument("--tasks-per-step", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--inflight", type=int, default=4)
    p.add_argument("--queue-maxsize", type=int, default=0, help="grpo.trl.queue_maxsize: "
                   "groups the sampler may queue ahead of the trainer (0: no bound). Pacing "
                   "only, not part of the budget: a small bound keeps a CPU trainer fed")
    p.add_argument("--checkpoint-every", type=int, default=5,
                   help="RL arms: a whole checkpoint every N steps (what --resume goes on from)")
    p.add_argument("--eval-every", type=int, default=0, help="RL arms: also evaluate on the "
                   "held-out sample every N steps while training (issue 37's in-training eval; "
                   "curves only: the table is every arm's final model, evaluated alike)")
    p.add_argument("--bonus", type=float, default=0.2, help="tool_call_bonus w")
    p.add_argument("--bonus-budget", type=int, default=20, help="tool_call_budget B")
    p.add_argument("--sft-lr", type=float, default=1e-5)
    p.add_argument("--sft-steps", type=int, default=0, help="the SFT model's optimizer "
                   "steps (0: --steps, the arms' budget)")
    p.add_argument("--sft-rows-per-step", type=int, default=0, help="rows per SFT step "
                   "(0: --group x --tasks-per-step)")
    p.add_argument("--sft-nice", action="store_true", help="train the SFT model outside "
                   "the heavy lock at nice 19 (CPU training only; teacher rollouts and "
                   "evals still take the lock)")
    p.add_argument("--teacher-tasks", type=int, default=0, help="train tasks per harness "
                   "the teacher runs (0: enough for one row per SFT example)")
    p.add_argument("--start", choices=["base", "sft"], default="base",
                   help="sft: every RL arm starts from the SFT model (when the base passes "
                   "no tier)")
    p.add_argument("--mode", choices=["chat", "token"], default="chat")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--max-model-calls", type=int, default=10)
    p.add_argument("--agent-timeout", type=float, default=180)
    p.add_argument("--eval-temperature", type=float, default=0.6)
    p.add_argument("--concurrency", type=int, default=4)
    args = p.parse_args(argv)
    for name in ("harnesses", "arms", "tiers", "calib_tiers"):
        setattr(args, name, [v for v in getattr(args, name).split(",") if v])
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    args.train_harness = args.train_harness or args.harnesses[0]
    if unknown := [a for a in args.arms if a not in ARMS]:
        p.error(f"unknown arms {unknown}; the arms are {', '.join(ARMS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    # `kill PID` unwinds like Ctrl-C: the running unit is not saved (redone on the next run),
    # subprocess.run kills its child, and vLLM servers die with their parent (PDEATHSIG).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    state = State(args.state)
    if args.phase != "report":
        check_budget(state, args)
        with (state.root / "commands.txt").open("a") as commands:
            commands.write(time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime()) + " ".join(
                ["python bench/seed_table.py", *(argv or sys.argv[1:])]) + "\n")
    if args.phase == "calibrate":
        calibrate(args, state)
    elif args.phase == "sft":
        sft_only(args, state)
    elif args.phase == "run":
        run(args, state)
    report(args, state)


def report(args: argparse.Namespace, state: State) -> None:
    """The .md and .png as measured so far, and (--record) a copy of the records."""
    seed_report.write(args, state.root)
    if args.record and args.record.resolve() != state.root.resolve():
        state.record(args.record)


if __name__ == "__main__":
    main()
