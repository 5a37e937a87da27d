"""The training side of bench/seed_table.py: the RL arms through `harnessrl train` (an arm
killed mid-run goes on from its newest whole checkpoint with `--resume`), the teacher's
rollouts through the harnesses and the SFT model trained on them."""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seed_state import PROGRESS, State, heavy, run_child, unit

HARNESSRL = str(Path(sys.executable).with_name("harnessrl"))


def rows_per_step(args: argparse.Namespace) -> int:
    return args.tasks_per_step * args.group


def start_model(args: argparse.Namespace, state: State, train: Path, seed: int, base: Path
                ) -> Path:
    """The weights every arm starts from: the base model, or (--start sft) the SFT one. A
    start built again that is not its first build has what was measured on the first set
    aside (the units from it finished before the new build started), to measure again."""
    if args.start == "base":
        return base
    model = sft_model(args, state, train, seed, base)
    if model is None:
        raise SystemExit(f"--start sft: no SFT model for seed {seed} (see "
                         f"{state.root / 'failed'})")
    built = state.done(f"sft/s{seed}") or {}
    if built.get("same_as_first_build") is False:
        stale = [n for n, u in state.all().items() if from_start(n, seed)
                 and u.get("finished", "") < built["started"]]
        if stale:
            state.replace_runs((), f"seed {seed}'s SFT start, built again on another machine, "
                               "is not its first build (its rows or per-step losses differ; "
                               "rebuilt/ has the first build's record): what was measured "
                               "on the first build is set aside and measured again. The "
                               "calibration stays: it chose the tasks, and any choice made "
                               "before training serves the paired comparison.",
                               finished=stale)
    return model


def from_start(unit: str, seed: int) -> bool:
    """Whether a unit was measured on seed `seed`'s start or on a model trained from it:
    its evals, an arm's training and evals, a probe (not its teachers or calibration)."""
    return re.match(rf"^(?:(?:train|eval[^/]*)/[^/]+/s{seed}(?:/|$)|probe/s{seed}/)",
                    unit) is not None


def train_arm(args: argparse.Namespace, state: State, train: Path, seed: int, arm: str,
              start: Path, base: Path, sft_train: Path | None = None) -> Path | None:
    """The arm's trained model directory (None: its training failed, recorded in STATE).
    `train`: the RL arms' tasks; `sft_train`: the teacher's (default the same)."""
    if arm == "sft":
        return start if args.start == "sft" else sft_model(args, state, sft_train or train,
                                                           seed, base)
    name = f"train/{arm}/s{seed}"
    result = unit(state, name, lambda: rl(args, state, train, seed, arm, start, name))
    return Path(result["model"]) if result else None


def probe(args: argparse.Namespace, state: State, train: Path, seed: int, start: Path,
          recipe: dict[str, Any]) -> dict[str, Any] | None:
    """The run's recipe on one training task alone (`--probe-task`), with no eval: can it
    teach a task it samples every step? Each step's pass rate is the task's curve. A unit
    of its own per seed, task and lr (`probe/s<seed>/<task>/lr<lr>`), its recipe beside."""
    task = args.probe_task
    one = state.root / "tasks" / f"probe-s{seed}-{task}"
    if not (one / task).is_dir():
        if not (train / task).is_dir():
            raise SystemExit(f"--probe-task {task} is not one of seed {seed}'s training tasks"
                             f" ({train})")
        shutil.copytree(train / task, one / task)
    alone = argparse.Namespace(**{**vars(args), "eval_every": 0})
    name = f"probe/s{seed}/{task}/lr{args.lr:g}"
    return unit(state, name, lambda: {
        **rl(alone, state, one, seed, "rl-one", start, name), "recipe": recipe})


# ------------------------------------------------------------------ RL
# The control arm (issue 46): rl-one's sampling, steps and optimizer with each group's
# advantages shuffled among its rollouts, so an update that follows no reward measures
# what "any update" and sampling noise do. The one place that names issue 45's setting.
CONTROL = {"grpo": {"advantage_control": "shuffle"}}


def arm_harnesses(args: argparse.Namespace, arm: str) -> list[str]:
    return list(args.harnesses) if arm == "rl-all" else [args.train_harness]


def merged(config: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`config` with `override`'s leaves set (nested tables merged, not replaced)."""
    out = dict(config)
    for key, value in override.items():
        out[key] = merged(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def rl_config(args: argparse.Namespace, train: Path, seed: int, arm: str, start: Path,
              run_dir: Path) -> dict[str, Any]:
    """The arm's train config: the same budget for every arm; only the harnesses (rl-all),
    the tool-call bonus (rl-one-bonus) and the shuffled advantages (control) differ."""
    config = {
        "run_dir": str(run_dir), "model": {"path": str(start)},
        "engine": {"mode": args.mode, "dtype": "float32", "max_model_len": 8192,
                   "max_tokens": args.max_tokens, "temperature": 1.0},
        "rollout": {"harnesses": arm_harnesses(args, arm), "tasks": str(train), "mix": "group",
                    "concurrency": args.inflight, "retries": 1,
                    "agent_timeout": args.agent_timeout,
                    "max_model_calls": args.max_model_calls},
        "grpo": {"trainer": "async", "steps": args.steps, "num_generations": args.group,
                 "tasks_per_step": args.tasks_per_step, "max_inflight": args.inflight,
                 "max_staleness": args.max_staleness, "learning_rate": args.lr, "seed": seed,
                 "truncated_turns": args.truncated_turns, "rejected_turns": args.rejected_turns,
                 "format_penalty": args.format_penalty,
                 "trl": {"queue_maxsize": args.queue_maxsize}},
        "shaping": {"tool_call_bonus": args.bonus if arm == "rl-one-bonus" else 0.0,
                    "tool_call_budget": args.bonus_budget},
        "checkpoint": {"every_steps": args.checkpoint_every, "keep": 1},
        # issue 37's eval while training, on the held-out sample in every eval harness
        "eval": {"every_steps": args.eval_every, "tasks": str(args.heldout_dir),
                 "harnesses": list(args.curve_harnesses), "slots": 1,
                 "temperature": args.eval_temperature} if args.eval_every else {},
    }
    return merged(config, CONTROL) if arm == "control" else config


def rl(args: argparse.Namespace, state: State, train: Path, seed: int, arm: str, start: Path,
       name: str) -> dict[str, Any]:
    import yaml

    from harnessrl.train.runs.checkpoint import complete

    run_dir = state.work(name)
    resume = bool(complete(run_dir / "checkpoints"))
    if not resume:  # nothing whole to go on from: the arm starts again
        if (state.root / "progress" / (name.replace("/", "__") + PROGRESS)).is_file():
            state.replace_runs((name,), f"{name}: the steps of a run whose checkpoints are "
                               "gone (a replaced machine, or a kill before the first "
                               "checkpoint); the run started again from its first step")
        shutil.rmtree(run_dir, ignore_errors=True)
    # written after the set-aside above, which deletes the run's files in work/
    config = run_dir.with_name(run_dir.name + ".yaml")
    config.write_text(yaml.safe_dump(rl_config(args, train, seed, arm, start, run_dir)))
    command = [HARNESSRL, "train", "--config", str(config), *(["--resume"] if resume else [])]
    with heavy(args.lock, name), state.log(name).open("a") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        def keep() -> None:
            state.progress(name, run_dir / "metrics.jsonl")

        code = run_child(command, log, every=keep)
        keep()  # the steps since the last minute's copy, if the run ended short
    if code != 0 or not (run_dir / "model").is_dir():
        raise RuntimeError(f"harnessrl train exited {code} (log: {state.log(name)})")
    from harnessrl.train.runs.eval_during import eval_lines

    evals = [{"step": line["step"], "eval": {h: {"passed": e["passed"], "rollouts": e["rollouts"]}
                                             for h, e in line["eval"].items()}}
             for line in eval_lines(run_dir / "metrics.jsonl")]
    return {"model": str(run_dir / "model"), "resumed": resume, "evals": evals,
            "harnesses": arm_harnesses(args, arm), "steps": step_lines(run_dir / "metrics.jsonl")}


# Issue 45's per-step diagnostics in metrics.jsonl, kept where a run logs them: the share
# of finished groups with reward spread, KL to the sampler, clip and mask fractions.
DIAGNOSED = ("groups_with_spread", "groups_uniform", "no_gradient", "kl", "clip_fraction",
             "rejected_share", "truncated_share", "advantage_abs", "tokens_trained_share")


def step_lines(metrics: Path) -> list[dict[str, Any]]:
    """Per optimizer step: reward (the mean of the step's rows, as TRL logs it), loss,
    gradient norm (0: no group had mixed rewards, so nothing moved), issue 45's diagnostics
    where logged, and per harness the pass rate, reward, tool calls and model calls
    (turns) of the step's rollouts (per rollout, whatever rows each made)."""
    lines = []
    for text in metrics.read_text().splitlines():
        try:
            line = json.loads(text) if text.strip() else {}
        except ValueError:  # a line cut mid-write, in a copy taken while the run writes
            continue
        if "trl" not in line:
            continue  # an eval line, not a step's
        lines.append({"step": line["step"], "reward": line.get("reward"),
                      "loss": line["trl"].get("loss"), "grad_norm": line["trl"].get("grad_norm"),
                      **{k: line[k] for k in DIAGNOSED if line.get(k) is not None},
                      "harnesses": {h: {"pass_rate": g.get("pass_rate"),
                                        "reward": g.get("reward"),
                                        "tool_calls": g.get("tool_calls"),
                                        "turns": g.get("turns")}
                                    for h, g in line.get("harnesses", {}).items()}})
    return lines


# ------------------------------------------------------------------ the teacher and SFT
def teacher_tasks(args: argparse.Namespace, train: Path, seed: int) -> list[Any]:
    """The training tasks the teacher runs in each harness: enough for one SFT row per
    example of the SFT arm's budget (or --teacher-tasks), a fixed seeded subset."""
    import random

    from harnessrl.rollout.tasks.task import load_tasks

    # One task per first instruction line: the policy tells tasks apart by it, and two
    # tasks sharing it (a count question on two tables of one kind) would share a listing.
    tasks = sorted({_key(t): t for t in sorted(load_tasks(train), key=lambda t: t.id,
                                               reverse=True)}.values(), key=lambda t: t.id)
    steps, per_step = sft_budget(args)
    wanted = args.teacher_tasks or math.ceil(steps * per_step / len(args.teacher_harnesses))
    return sorted(random.Random(f"teacher:{seed}").sample(tasks, min(wanted, len(tasks))),
                  key=lambda t: t.id)


def teacher_command(task: Any) -> str:
    """The task's reference program, inline (a heredoc), so what the student learns to
    write is the program that computes the answer from the table, not a path to it."""
    program = task.solution_dir / "solve.py" if task.solution_dir else None
    if program is not None and program.is_file():
        text = program.read_text()
        return f"python3 - <<'PY'\n{text}{'' if text.endswith(chr(10)) else chr(10)}PY"
    if task.solution_dir is not None:
        return (task.solution_dir / "solve.sh").read_text()
    return "\n".join(task.solution_commands)


def _key(task: Any) -> str:
    return task.instruction.strip().splitlines()[0][:100]


def teacher_policy(tasks: list[Any], whole_file: bool) -> Any:
    """The oracle's policy (`harnessrl run --oracle`) with the programs inline; for a
    harness that only writes files (aider), the files each program writes."""
    from harnessrl.proxy.engines.policy import OraclePolicy
    from harnessrl.rollout.run import written_by_solution

    async def listings() -> dict[str, dict[str, str]]:
        with tempfile.TemporaryDirectory(prefix="hrl-teacher-") as root:
            return {_key(t): await written_by_solution(t, Path(root), f"t{n}")
                    for n, t in enumerate(tasks)}

    return OraclePolicy({_key(t): teacher_command(t) for t in tasks},
                        asyncio.run(listings()) if whole_file else {})


def teacher(args: argparse.Namespace, state: State, train: Path, seed: int, harness: str
            ) -> dict[str, Any] | None:
    name = f"teacher/{harness}/s{seed}"

    def work() -> dict[str, Any]:
        from rich.console import Console

        from harnessrl.harnesses import get
        from harnessrl.proxy.engines.scripted import ScriptedEngine
        from harnessrl.rollout.conformance import policy_tokenizer
        from harnessrl.rollout.run import execute
        from harnessrl.rollout.runner import RolloutSettings, RunSettings

        tasks, chosen = teacher_tasks(args, train, seed), get(harness)
        run_dir = state.work(name)
        shutil.rmtree(run_dir, ignore_errors=True)
        config = RunSettings(harnesses=[chosen], tasks=tasks, settings=RolloutSettings(
            concurrency=args.concurrency, retries=1, agent_timeout=args.agent_timeout,
            max_model_calls=args.max_model_calls))
        with heavy(args.lock, name), state.log(name).open("w") as log:
            engine = ScriptedEngine(policy_tokenizer(), teacher_policy(
                tasks, chosen.finish == "whole-file"), model="teacher")
            outcomes = execute(config, engine, run_dir, console=Console(file=log))
        done = [o for o in outcomes if o.status == "done"]
        return {"run_dir": str(run_dir), "rollouts": len(outcomes),
                "solved": sum((o.verifier_reward or 0) >= 1 for o in done),
                "infra_errors": len(outcomes) - len(done)}

    return unit(state, name, work)


def sft_model(args: argparse.Namespace, state: State, train: Path, seed: int, base: Path
              ) -> Path | None:
    """The seed's SFT model, built once; built again where its record names a model this
    machine does not have (a replaced machine), from its recorded rows (`sft_data`), or
    teacher runs first where none were recorded. The record's figures were measured on the
    first build, so the new one is checked against it (`same_as_first_build`;
    `start_model` acts on it)."""
    name = f"sft/s{seed}"
    if (found := state.done(name)) is not None and not Path(found["model"]).is_dir():
        print(f"[seed_table] {name}: {found['model']} is not on this machine: built again",
              flush=True)
        teachers = [f"teacher/{h}/s{seed}" for h in args.teacher_harnesses]
        state.rebuild([name, *([] if rows_file(state, seed).is_file() else teachers)])
    runs = {h: teacher(args, state, train, seed, h) for h in args.teacher_harnesses}
    if any(r is None for r in runs.values()):
        return None
    result = unit(state, name, lambda: sft(args, state, runs, seed, base, name))
    return Path(result["model"]) if result else None


def sft_rows(runs: dict[str, Any], tokenizer: Any, work: Path) -> tuple[list[dict[str, Any]],
                                                                         dict[str, int]]:
    """The teacher's solved rollouts as the student's token rows (its template, a mask on
    the assistant turns the teacher sampled, not the harness's own example turns): text
    re-tokenized, since the teacher sampled no student ids."""
    from datasets import Dataset

    from harnessrl.train.export.sft import export_sft, tokenized_messages

    rows, per_harness = [], {}
    for harness, run in runs.items():
        exported = export_sft(Path(run["run_dir"]), work / f"{harness}.parquet",
                              kind="messages")
        per_harness[harness] = exported.rows
        if not exported.rows:
            continue
        for row in Dataset.from_parquet(str(exported.path)):
            assert isinstance(row, dict)
            ids, mask = tokenized_messages(tokenizer, row["messages"],
                                           json.loads(row["tools"]) or None)
            rows.append({"input_ids": ids, "assistant_masks": mask})
    return rows, per_harness


def rows_file(state: State, seed: int) -> Path:
    return state.root / "rows" / f"sft-s{seed}.json.gz"


def sft_data(state: State, seed: int,
             make: Callable[[], tuple[list[dict[str, Any]], dict[str, int]]]
             ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The SFT start's token rows, made once and kept in the records (STATE/rows/, ~10 KB
    gzipped): the teacher's rollouts carry a sandbox's random path and the day's date into
    the prompts, so a start built again from new teacher runs is not the same model; from
    the same rows it is the same computation (`compared` checks its losses)."""
    path = rows_file(state, seed)
    if not path.is_file():
        rows, per_harness = make()
        path.parent.mkdir(exist_ok=True)
        data = {"rows": rows, "rows_per_harness": per_harness}
        path.write_bytes(gzip.compress(json.dumps(data).encode(), mtime=0))
        state.mirrored()
    data = json.loads(gzip.decompress(path.read_bytes()))
    return data["rows"], data["rows_per_harness"]


def sft_budget(args: argparse.Namespace) -> tuple[int, int]:
    """The SFT model's optimizer steps and rows per step: the RL arms' budget unless
    --sft-steps / --sft-rows-per-step set the start's own (a start that must first learn
    the tool-call format can need more steps than the arms compared after it)."""
    return args.sft_steps or args.steps, args.sft_rows_per_step or rows_per_step(args)


def sft(args: argparse.Namespace, state: State, runs: dict[str, Any], seed: int, base: Path,
        name: str) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    work = state.work(name)
    tokenizer = AutoTokenizer.from_pretrained(base)
    rows, per_harness = sft_data(state, seed, lambda: sft_rows(runs, tokenizer, work))
    if not rows:
        raise RuntimeError("the teacher solved no task: nothing to learn from")
    out = state.root / "models" / f"sft-s{seed}"
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    steps, per_step = sft_budget(args)
    checkpoints = sorted((work / "trainer").glob("checkpoint-*"))  # a killed run goes on
    with heavy("" if args.sft_nice else args.lock, name):
        if args.sft_nice:  # CPU training only, at the lowest priority, beside heavy runs
            os.nice(19)
        trainer = SFTTrainer(
            model=AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
            train_dataset=Dataset.from_list(rows).shuffle(seed=seed),
            processing_class=tokenizer, args=SFTConfig(
                output_dir=str(work / "trainer"), max_steps=steps, seed=seed,
                per_device_train_batch_size=1, gradient_accumulation_steps=per_step,
                learning_rate=args.sft_lr, use_cpu=True, bf16=False, report_to="none",
                save_strategy="steps", save_steps=args.checkpoint_every, save_total_limit=1,
                logging_steps=1, max_length=None, disable_tqdm=True,
                dataloader_num_workers=0))
        trainer.train(resume_from_checkpoint=str(checkpoints[-1]) if checkpoints else None)
        trainer.save_model(str(partial))
        tokenizer.save_pretrained(str(partial))
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {**compared(state.first_build(name), losses, rows),
            "model": str(out), "rows": len(rows), "rows_per_harness": per_harness,
            "retokenized": True, "steps": steps, "rows_per_step": per_step, "lr": args.sft_lr,
            "resumed_from": checkpoints[-1].name if checkpoints else None,
            "losses": losses, "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
            "trained_tokens": sum(sum(r["assistant_masks"]) for r in rows)}


def compared(first: dict[str, Any] | None, losses: list[float], rows: list[dict[str, Any]]
             ) -> dict[str, Any]:
    """A rebuilt SFT model against its first build: as many rows and trained tokens, and
    the same losses step by step (to 1e-4), say it is the model the seed's figures were
    measured on (rows of the same size but other prompts show in the losses)."""
    if first is None:
        return {}
    tokens = sum(sum(r["assistant_masks"]) for r in rows)
    diff = max((abs(a - b) for a, b in zip(first["losses"], losses, strict=False)),
               default=None)
    same = (first["rows"] == len(rows) and first["trained_tokens"] == tokens
            and len(first["losses"]) == len(losses) and diff is not None and diff <= 1e-4)
    return {"first_build": {"finished": first.get("finished"), "rows": first["rows"],
                            "trained_tokens": first["trained_tokens"],
                            "max_loss_difference": diff},
            "same_as_first_build": same}
