"""The conformance check: a real harness, unmodified and headless, writes `hello.txt`
through the proxy driven by the scripted policy; then the workspace and the trace are
checked (the file, every call stored with exact tokens, the dialect, the chain)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.harnesses.base import Harness, RunContext
from harnessrl.proxy.engines.policy import WriteFilePolicy
from harnessrl.proxy.engines.scripted import ScriptedEngine
from harnessrl.proxy.serve import running
from harnessrl.rollout.rewards import TraceStats
from harnessrl.rollout.runner import open_rollout
from harnessrl.rollout.sandbox import Limits, LocalSandbox
from harnessrl.types import ToolResult, Turn

FILENAME = "hello.txt"
_WORDS = ("amber", "brook", "cedar", "delta", "ember", "fjord", "grove", "harbor", "iris",
          "juniper", "kestrel", "lagoon", "meadow", "nectar", "orchid", "pebble")


@dataclass
class Result:
    harness: str
    version: str
    dialect: str
    streamed: bool = False
    turns: int = 0
    # counted as the runner counts an Outcome's: the completions' native tool calls, or
    # the harness's own action record when no call offered a tool (`tool_call_source`)
    tool_calls: int = 0
    tool_call_source: str = "native"
    harness_actions: int | None = None  # what the harness's record says it ran, if any
    chain_extended: bool | None = None
    # seconds this run spent installing the harness; None: its prefix was already
    # installed (cached), so no figure is given
    install_seconds: float | None = None
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    output: str = ""

    @property
    def passed(self) -> bool:
        return not self.problems


def install_timed(harness: Harness, tools_dir: Path) -> float | None:
    """Install `harness` unless its prefix already is; the seconds it took, None if cached."""
    if harness.installed(tools_dir):
        return None
    started = time.monotonic()
    harness.install(tools_dir, log=lambda _line: None)
    return time.monotonic() - started


def random_line() -> str:
    return " ".join(secrets.choice(_WORDS) for _ in range(4)) + f" {secrets.randbelow(10**6)}"


def instruction_for(line: str) -> str:
    return (f"Create a file named {FILENAME} in the current directory containing exactly "
            f"this one line: {line}")


async def check(harness: Harness, *, tokenizer: Any, tools_dir: Path, root: Path,
                timeout: float = 300.0) -> Result:
    """Run `harness` once and check everything the conformance suite promises."""
    result = Result(harness.name, harness.version, harness.dialect)
    line = random_line()
    policy = WriteFilePolicy(FILENAME, line, harness.finish)
    engine = ScriptedEngine(tokenizer, policy, model="harnessrl-policy")
    started = time.monotonic()
    with running(engine, root / "run") as served:
        rollout = await open_rollout(served.url, {"harness": harness.name})
        output = await _run(harness, rollout, tools_dir, root, line, timeout, result)
        result.output = output[-4000:]
        result.seconds = time.monotonic() - started
        _check_trace(harness, served.store.turns(rollout["key"]), result)
    return result


async def _run(harness: Harness, rollout: dict[str, Any], tools_dir: Path, root: Path,
               line: str, timeout: float, result: Result) -> str:
    # Confined as the runner confines it, so conformance proves the harness works there.
    limits = Limits(memory_bytes=harness.memory_bytes) if harness.memory_bytes else Limits()
    sandbox = await LocalSandbox.create(root, f"sandbox-{harness.slug}", limits=limits,
                                        confine=LocalSandbox.confinement_available())
    try:
        ctx = RunContext(home=sandbox.home, workdir=sandbox.workdir,
                         proxy_root=rollout["base_url"], key=rollout["key"],
                         tools_dir=tools_dir)
        harness.setup(ctx)
        run = await sandbox.run(harness.command(ctx, instruction_for(line)),
                                env=harness.environment(ctx), timeout=timeout)
        outcome = harness.outcome(ctx, run.exit_code, run.stdout)
        result.harness_actions = outcome.actions
        if run.timed_out:
            result.problems.append(f"timed out after {timeout:.0f} s")
        elif not outcome.finished:
            result.problems.append(f"the harness did not finish: {outcome.detail}")
        written = sandbox.workdir / FILENAME
        if not written.is_file():
            result.problems.append(f"{FILENAME} was not created")
        elif written.read_text().strip() != line:
            result.problems.append(f"{FILENAME} holds {written.read_text()[:80]!r}")
        return (run.stdout + run.stderr).decode("utf-8", "replace")
    finally:
        await sandbox.close()


def _check_trace(harness: Harness, turns: list[Turn], result: Result) -> None:
    result.turns = len(turns)
    stats = TraceStats.of(turns, executed=result.harness_actions)
    result.tool_calls, result.tool_call_source = stats.tool_calls, stats.tool_call_source
    result.streamed = any(t.request is not None and t.request.stream for t in turns)
    if len(turns) < harness.min_turns:
        result.problems.append(f"{len(turns)} model calls stored, expected at least "
                               f"{harness.min_turns}")
    for turn in turns:
        tokens = turn.completion.tokens if turn.completion else None
        if turn.status != "ok" or turn.flags:
            result.problems.append(f"turn {turn.index}: {turn.status} {turn.error or ''} "
                                   f"{list(turn.flags)}".strip())
        elif not (tokens and tokens.prompt_ids and tokens.completion_ids and tokens.logprobs
                  and len(tokens.logprobs) == len(tokens.completion_ids)):
            result.problems.append(f"turn {turn.index}: exact tokens missing")
        if turn.dialect != harness.dialect:
            result.problems.append(f"turn {turn.index} spoke {turn.dialect}, expected "
                                   f"{harness.dialect}")
    result.chain_extended = _tool_result_extends_call(turns)
    if result.chain_extended is False:
        result.problems.append("the turn carrying the tool result does not extend the call")


def _tool_result_extends_call(turns: list[Turn]) -> bool | None:
    """Does the first turn that carries a tool result extend the turn that made the call?
    None when no tool was used."""
    for position, turn in enumerate(turns):
        request = turn.request
        if request is None or not any(isinstance(p, ToolResult) for m in request.messages
                                      for p in m.parts):
            continue
        caller = next((t for t in reversed(turns[:position])
                       if t.completion is not None and t.completion.tool_calls), None)
        if caller is None or caller.completion is None or turn.completion is None:
            return False
        before = caller.completion.tokens
        prefix = (before.prompt_ids or ()) + (before.completion_ids or ())
        return (turn.completion.tokens.prompt_ids or ())[: len(prefix)] == prefix
    return None


def matrix_markdown(results: list[Result]) -> str:
    rows = ["| harness | version | dialect | install s | streamed | turns | tool calls "
            "| chain extended | seconds | pass |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        chain = {True: "yes", False: "no", None: "n/a"}[r.chain_extended]
        verdict = "PASS" if r.passed else "FAIL: " + "; ".join(r.problems)
        install = "cached" if r.install_seconds is None else f"{r.install_seconds:.1f}"
        rows.append(f"| {r.harness} | {r.version} | {r.dialect} | {install} | "
                    f"{'yes' if r.streamed else 'no'} | {r.turns} | "
                    f"{r.tool_calls} ({r.tool_call_source}) | {chain} | "
                    f"{r.seconds:.1f} | {verdict} |")
    return "\n".join(rows) + "\n"


def policy_tokenizer(cache: Path = Path("~/.cache/harnessrl/models/tiny-qwen2")) -> Any:
    """The scripted policy speaks through the tiny model's tokenizer and template."""
    from transformers import AutoTokenizer

    from harnessrl.models.tiny import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model(cache.expanduser()))
