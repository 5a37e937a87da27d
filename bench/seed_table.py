#!/usr/bin/env python3
"""The seed's experiment in kind (issues 40 and 46), on a CPU: does training SmolLM2-135M in
one harness, or in several, help in each, against its start and against a control; what a
tool-call bonus and SFT do. Figures, not a test.

Arms, each from the same start with the same seeds and budget (optimizer steps x rows per
step), each evaluated on the same held-out tasks in every eval harness (pass rate with a
Wilson 95% interval; per task and seed paired against the start and the control):

    base          the base weights, untrained
    rl-one        GRPO in one harness (--train-harness)
    control       rl-one with the advantages shuffled within each group (issue 45's
                  [grpo] advantage_control): what any update and sampling noise do
    rl-all        GRPO in every eval harness at once, one harness per group
    rl-one-bonus  rl-one with the reference's tool-call bonus r*(1 + w*B/(B + calls))
    sft           SFT on teacher rollouts: each task's reference program driven through the
                  harnesses by a scripted policy (text, no student ids: re-tokenized by the
                  student's template, flagged so); with --start sft, the start itself

Phases: `sft` (each seed's SFT start: the teacher's rollouts under the heavy lock and the
training, with --sft-nice outside it at nice 19; its budget is its own, budget-sft.json),
`calibrate` (each task's pass rate from --calib-samples rollouts at the training
temperature, for the base model or each seed's SFT start, per harness, split and tier, in
cells of 8 tasks that --calib-per-tier can add to), `run` (the arms; --select trains on the
tasks whose calibrated pass rate is in --band and evaluates on up to --heldout-sample
held-out tasks in it; --eval-samples rollouts per task at each of --eval-temperatures),
`report` (the .md and .png from what is measured, and <out>_curves.png). Every unit of work
(a calibration cell, a teacher run, an arm's training, a chunk of 8 held-out tasks of an
arm x harness eval) writes its result to STATE/units/*.json and is skipped when run again,
so a rerun after a kill goes on; an RL arm killed mid-training goes on from its newest
whole checkpoint (`harnessrl train --resume`). Heavy units take /tmp/harnessrl-heavy.lock
(flock) for their own duration only. `--record DIR` copies the small records (no weights)
to a folder in the repository whenever a unit or a failure is written, a training run's
lines each minute and the report at the end, so the figures outlive the machine.
docs/seed-table.md gives the commands of each experiment.
"""

from __future__ import annotations

import argparse
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
import seed_runs
import seed_visits
from seed_budget import ARMS, RL_RECIPE, check_budget
from seed_sets import (
    calibration_cells,
    eval_chunks,
    generated,
    seed_tasks,
    split_dir,
)
from seed_state import WAITED, State, event, heavy, run_child, unit

HARNESSRL = str(Path(sys.executable).with_name("harnessrl"))
# ------------------------------------------------------------------ evaluation
def eval_cell(args: argparse.Namespace, state: State, name: str, url: str, harness: str,
              tasks: Path, samples: int = 1, temperature: float | None = None
              ) -> dict[str, Any]:
    """`harnessrl eval` of the served model in one harness on a task dir (`samples` rollouts
    per task at `temperature`, default the eval temperature); its figures and each
    rollout's outcome. An interrupted cell is redone whole (its run dir removed)."""
    run_dir = state.work(name)
    shutil.rmtree(run_dir, ignore_errors=True)
    temperature = args.eval_temperature if temperature is None else temperature
    command = [HARNESSRL, "eval", "--harness", harness, "--tasks", str(tasks),
               "-k", str(samples), "--engine-url", url, "--run-dir", str(run_dir),
               "--concurrency", str(args.concurrency), "--retries", "1",
               "--agent-timeout", str(args.agent_timeout), "--max-tokens", str(args.max_tokens),
               "--temperature", str(temperature),
               "--max-model-calls", str(args.max_model_calls)]
    with state.log(name).open("w") as log:
        code = run_child(command, log)
    return {"returncode": code, "samples": samples, "temperature": temperature,
            **figures(run_dir, samples)}


UNPARSED_MARK = "tool_call>"  # a call written as text that the harness's parser missed


def unparsed(turn: Any) -> bool:
    """A turn whose reply holds a call in text (`<tool_call>`) but no parsed call: the
    harness ran nothing for it, so it costs no tool call (the tool-call bonus pays it)."""
    from harnessrl.types import Text

    completion = turn.completion
    if completion is None or completion.tool_calls:
        return False
    return any(isinstance(p, Text) and UNPARSED_MARK in p.text for p in completion.parts)


def figures(run_dir: Path, samples: int = 1) -> dict[str, Any]:
    """The cell's eval row and per rollout its outcome: keyed by task (one sample) or
    `task#sample` (several; seed_stats.per_task pools them), with the calls the harness
    ran (`tool_calls`, from `tool_call_source`) and the turns it answered and could not
    parse beside."""
    from harnessrl.rollout.evaluate import evaluate
    from harnessrl.store.reader import TraceReader

    with TraceReader(run_dir) as store:
        outcomes = store.outcomes()
        if not outcomes:
            raise RuntimeError(f"{run_dir}: the eval recorded no outcome")
        prompts, errors, turns = [], {}, {}
        for outcome in outcomes:
            answered = missed = 0
            for turn in store.turns(outcome.rollout):
                if turn.status != "ok":
                    errors[turn.error_kind or turn.status] = errors.get(
                        turn.error_kind or turn.status, 0) + 1
                    continue
                answered += 1
                missed += unparsed(turn)
                if turn.completion and turn.completion.tokens.prompt_ids:
                    prompts.append(len(turn.completion.tokens.prompt_ids))
            turns[outcome.rollout] = (answered, missed)
    [row] = evaluate(outcomes, samples)
    per_task = {(o.task if samples == 1 else f"{o.task}#{o.sample}"): {
        "status": o.status, "passed": (o.verifier_reward or 0) >= 1,
        "tool_calls": o.tool_calls, "tool_call_source": o.tool_call_source, "turns": o.turns,
        "answered_turns": turns[o.rollout][0], "unparsed_turns": turns[o.rollout][1]}
        for o in outcomes}
    return {"eval": asdict(row), "per_task": per_task, "turn_errors": errors,
            "prompt_tokens_max": max(prompts, default=None),
            "prompt_tokens_first": min(prompts, default=None)}


def served_evals(args: argparse.Namespace, state: State, model: Path, label: str,
                 cells: list[tuple[str, str, Path]], samples: int = 1,
                 temperature: float | None = None) -> None:
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
                    args, state, n, server.url, h, t, samples, temperature))
                report(args, state)  # the .md as measured so far


# ------------------------------------------------------------------ the phases
def base_model(args: argparse.Namespace) -> Path:
    from rich.console import Console

    from harnessrl.train.loop import resolve_model

    return resolve_model(args.model, Console(stderr=True))


def calibrate(args: argparse.Namespace, state: State) -> None:
    """Each task's pass rate from `--calib-samples` rollouts at `--calib-temperature` (the
    training temperature), per start (base, or a seed's SFT model), harness, split and
    tier: what `--select` picks the run's tasks from."""
    tasks = generated(state, args, args.tiers, (args.train_tasks, args.heldout))
    for seed in args.seeds if args.start == "sft" else [None]:
        if seed is None:
            model, label = base_model(args), f"base-t{args.calib_temperature:g}"
        else:
            found = state.done(f"sft/s{seed}")
            if found is None:
                raise SystemExit(f"calibrate --start sft: no SFT model for seed {seed} in "
                                 f"{state.root}: run the sft phase first")
            model, label = Path(found["model"]), f"sft-s{seed}-t{args.calib_temperature:g}"
        cells = calibration_cells(args, state, tasks, label)
        served_evals(args, state, model, f"calibration-{label}", cells,
                     samples=args.calib_samples, temperature=args.calib_temperature)


def sft_only(args: argparse.Namespace, state: State) -> None:
    tasks = generated(state, args, args.tiers, (args.train_tasks, args.heldout))
    train, base = split_dir(tasks, "train"), base_model(args)
    for seed in args.seeds:
        arms.sft_model(args, state, train, seed, base)


def run(args: argparse.Namespace, state: State) -> None:
    tasks = generated(state, args, args.tiers, (args.train_tasks, args.heldout))
    base = base_model(args)
    for seed in args.seeds:
        train, args.heldout_dir = seed_tasks(args, state, tasks, seed)
        cells = {arm: arm_cells(args, state, arm, seed) for arm in args.arms}
        for arm in args.arms:
            set_aside_lost(state, arm, seed, cells[arm])
        if not any(arm_pending(state, arm, seed, cells[arm]) for arm in args.arms):
            continue  # all measured: its start is not needed (nor built again)
        # a start built again that is not its first build sets aside what it measured
        start = arms.start_model(args, state, split_dir(tasks, "train"), seed, base)
        for arm in args.arms:
            if not arm_pending(state, arm, seed, cells[arm]):
                continue
            model = base if arm == "base" else arms.train_arm(
                args, state, train, seed, arm, start, base, split_dir(tasks, "train"))
            if model is None:
                continue  # its training failed: recorded in STATE/failed, retried next run
            for temperature, temperature_cells in cells[arm]:
                served_evals(args, state, model, f"{arm}-s{seed}", temperature_cells,
                             samples=args.eval_samples, temperature=temperature)
            report(args, state)


def arm_cells(args: argparse.Namespace, state: State, arm: str, seed: int
              ) -> list[tuple[float, list[tuple[str, str, Path]]]]:
    """The arm's eval cells per temperature: (unit, harness, chunk's task dir)."""
    kinds = [("eval" if n == 0 else f"eval@{t:g}", t)
             for n, t in enumerate(args.eval_temperatures)]
    return [(t, [(f"{kind}/{arm}/s{seed}/{h}/{chunk}", h, where) for h in args.harnesses
                 for chunk, where in eval_chunks(state, args.heldout_dir)])
            for kind, t in kinds]


def arm_pending(state: State, arm: str, seed: int,
                cells: list[tuple[float, list[tuple[str, str, Path]]]]) -> bool:
    """Whether the arm has training or eval left."""
    if arm not in ("base", "sft") and state.done(f"train/{arm}/s{seed}") is None:
        return True
    return any(state.done(c[0]) is None for _, group in cells for c in group)


def set_aside_lost(state: State, arm: str, seed: int,
                   cells: list[tuple[float, list[tuple[str, str, Path]]]]) -> None:
    """An RL arm whose model is not on this machine (a replaced one) while its eval is not
    whole is set aside, its measured chunks with it (an eval cell is one model's), to be
    trained and measured again; with its eval whole, its model is not needed."""
    name = f"train/{arm}/s{seed}"
    trained = None if arm in ("base", "sft") else state.done(name)
    if trained is None or Path(trained["model"]).is_dir() or not arm_pending(
            state, arm, seed, cells):
        return
    measured = [c[0] for _, group in cells for c in group if state.done(c[0])]
    state.replace_runs((name,), f"{name}: its model was lost with its machine before its "
                       "eval was whole; trained again", finished=[name, *measured])


def probe(args: argparse.Namespace, state: State) -> None:
    """`probe`: each seed's start trained on --probe-task alone (arms.probe)."""
    if not args.probe_task:
        raise SystemExit("probe: name the training task to train on alone (--probe-task)")
    tasks = generated(state, args, args.tiers, (args.train_tasks, args.heldout))
    base = base_model(args)
    for seed in args.seeds:
        train, _ = seed_tasks(args, state, tasks, seed)
        start = arms.start_model(args, state, split_dir(tasks, "train"), seed, base)
        arms.probe(args, state, train, seed, start, {k: getattr(args, k) for k in RL_RECIPE})


# ------------------------------------------------------------------ the command line
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("phase", choices=["calibrate", "sft", "run", "probe", "report"])
    p.add_argument("--state", type=Path, default=Path("runs/seed_table"))
    p.add_argument("--out", type=Path, default=Path("bench/seed_table.md"))
    p.add_argument("--plot", type=Path, default=Path("bench/seed_table.png"))
    p.add_argument("--record", type=Path, default=None, help="copy the state's small records "
                   "(units, budgets, commands, notes) here as each is written, to commit")
    p.add_argument("--lock", default="/tmp/harnessrl-heavy.lock", help="'' for none")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--harnesses", default="mini-swe-agent,aider,pi",
                   help="eval harnesses (rl-all trains in all of them)")
    p.add_argument("--train-harness", default=None, help="rl-one's (default: the first)")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--tiers", default="lookup,count,filter,sum,groupmax,join")
    p.add_argument("--calib-tiers", default="lookup,count,filter,sum,groupmax,join")
    p.add_argument("--calib-per-tier", type=int, default=16, help="tasks per tier and "
                   "split, in cells of 8 (more later: new cells, the measured ones kept)")
    p.add_argument("--calib-splits", default="train,heldout")
    p.add_argument("--calib-harnesses", default="", help="default: --harnesses")
    p.add_argument("--calib-samples", type=int, default=4, help="rollouts per task")
    p.add_argument("--calib-temperature", type=float, default=1.0,
                   help="the training temperature (the RL arms sample at 1.0)")
    p.add_argument("--select", action="store_true", help="run: train on the training tasks "
                   "whose calibrated pass rate (this seed's start, the train harness, the "
                   "training temperature) is in --band, and evaluate on up to "
                   "--heldout-sample held-out tasks in it")
    p.add_argument("--band", default="0.3,0.8", help="--select's pass-rate band, low,high")
    p.add_argument("--eval-samples", type=int, default=1, help="rollouts per held-out task")
    p.add_argument("--eval-temperatures", default="", help="comma-separated; the first is "
                   "the table's (eval/...), others are cells eval@T/... (default: "
                   "--eval-temperature)")
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
    p.add_argument("--probe-task", default="", help="probe: the training task (of the "
                   "seed's, --select's) trained on alone with the run's recipe")
    p.add_argument("--truncated-turns", choices=["mask", "penalty", "train"], default="mask",
                   help="grpo.truncated_turns: a reply cut by --max-tokens is left out of the "
                   "loss, pushed down on its own (-format_penalty) or trained as the rest")
    p.add_argument("--rejected-turns", choices=["mask", "penalty", "train"], default="mask",
                   help="grpo.rejected_turns: the same for a reply the harness dropped from its "
                   "history (one it could not parse)")
    p.add_argument("--format-penalty", type=float, default=1.0, help="grpo.format_penalty")
    p.add_argument("--replace-recipe", default="", metavar="WHY", help="run: change the RL "
                   "recipe after an RL arm finished; its units and evals are set aside "
                   "(STATE/replaced/) with WHY, and every RL arm trains again")
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
    p.add_argument("--curve-harnesses", default="", help="--eval-every's harnesses (default: "
                   "--harnesses): each curve point is a pass of the held-out tasks in each")
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
    p.add_argument("--teacher-harnesses", default="", help="the harnesses the teacher's SFT "
                   "rollouts run in (default: --harnesses): the start can be built from all "
                   "three while the run evaluates in fewer")
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
    for name in ("harnesses", "arms", "tiers", "calib_tiers", "calib_splits",
                 "calib_harnesses", "teacher_harnesses", "curve_harnesses"):
        setattr(args, name, [v for v in getattr(args, name).split(",") if v])
    args.calib_harnesses = args.calib_harnesses or args.harnesses
    args.teacher_harnesses = args.teacher_harnesses or args.harnesses
    args.curve_harnesses = args.curve_harnesses or args.harnesses
    args.band = [float(v) for v in args.band.split(",")]
    args.eval_temperatures = [float(v) for v in args.eval_temperatures.split(",") if v] or [
        args.eval_temperature]
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
    state = State(args.state, args.record)
    if args.phase != "report":
        if args.phase != "probe":  # a probe's recipe is in its unit: it may try others
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
    elif args.phase == "probe":
        probe(args, state)
    report(args, state)


def report(args: argparse.Namespace, state: State) -> None:
    """The .md and .png as measured so far, and (--record) a copy of the records."""
    trained = [name for name in {**state.all(), **seed_runs.runs(state.root / "progress")}
               if name.startswith(("train/", "probe/"))]
    run = seed_report.read_json(state.root / "budget-run.json")
    seed_visits.keep(state.root, trained, run.get("group") or args.group)
    seed_report.write(args, state.root)
    state.mirrored()


if __name__ == "__main__":
    main()
