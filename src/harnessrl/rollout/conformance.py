"""The conformance check: a real harness, unmodified and headless, writes `hello.txt`
through the proxy driven by the scripted policy; then the workspace and the trace are
checked (the file, every call stored with exact tokens, the dialect, the chain).

Two modes, the proxy's two ways to a model: `chat`, the scripted chat engine (the engine
renders and tokenizes each prompt itself, as vLLM's chat endpoint does), and `token`, the
proxy's own TokenEngine rendering the chat template and sending ids to a scripted
`/v1/completions` server over loopback (`ScriptedCompletions`), the wire it speaks to vLLM.
Both replay the same policy's replies as ids of the same tokenizer.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harnessrl.harnesses.base import Harness, RunContext
from harnessrl.proxy.engines.base import Engine
from harnessrl.proxy.engines.policy import WriteFilePolicy
from harnessrl.proxy.engines.scripted import Policy, ScriptedEngine
from harnessrl.proxy.engines.scripted_completions import ScriptedCompletions
from harnessrl.proxy.engines.token.engine import TokenEngine
from harnessrl.proxy.serve import in_thread, running
from harnessrl.rollout.analysis.atlas import Entry
from harnessrl.rollout.analysis.chains import rollout_stats
from harnessrl.rollout.rewards import TraceStats
from harnessrl.rollout.runner import open_rollout
from harnessrl.rollout.sandbox import registry
from harnessrl.rollout.sandbox.base import BackendOptions, Limits, SandboxError
from harnessrl.rollout.sandbox.local import confinement_available
from harnessrl.types import ToolResult, Turn

FILENAME = "hello.txt"
MODEL = "harnessrl-policy"
Mode = Literal["chat", "token"]
MODES: tuple[Mode, ...] = ("chat", "token")
# token mode: the scripted completions server, given the tokenizer (a test may pass a
# faulty one to see the check fail)
Backend = Callable[[Any], ScriptedCompletions]
_WORDS = ("amber", "brook", "cedar", "delta", "ember", "fjord", "grove", "harbor", "iris",
          "juniper", "kestrel", "lagoon", "meadow", "nectar", "orchid", "pebble")


@dataclass
class Result:
    harness: str
    version: str
    dialect: str
    mode: Mode = "chat"
    streamed: bool = False
    turns: int = 0
    # counted as the runner counts an Outcome's: the completions' native tool calls, or
    # the harness's own action record when no call offered a tool (`tool_call_source`)
    tool_calls: int = 0
    tool_call_source: str = "native"
    harness_actions: int | None = None  # what the harness's record says it ran, if any
    chain_extended: bool | None = None
    # of the turns continuing a conversation, the share that extends it (rollout.analysis.chains)
    extension_rate: float | None = None
    # seconds this run spent installing the harness; None: its prefix was already
    # installed (cached), so no figure is given
    install_seconds: float | None = None
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    output: str = ""
    # the drift atlas of the run (rollout.analysis.atlas): breaks by cause, calls by kind
    drift: Entry = field(default_factory=Entry)

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


def _scripted_completions(tokenizer: Any) -> ScriptedCompletions:
    return ScriptedCompletions(tokenizer, model=MODEL)


async def check(harness: Harness, *, tokenizer: Any, tools_dir: Path, root: Path,
                timeout: float = 300.0, mode: Mode = "chat",
                backend: Backend = _scripted_completions,
                token_options: dict[str, Any] | None = None,
                speaks: Callable[[Policy], Policy] | None = None) -> Result:
    """Run `harness` once in `mode` and check everything the conformance suite promises.
    Token mode: `token_options` go to the TokenEngine (e.g. a `renderer` family; default:
    the tokenizer's own template, hermes calls) and `speaks` rewrites the policy's replies
    into the model's markup (the policy writes Hermes calls)."""
    result = Result(harness.name, harness.version, harness.dialect, mode)
    line = random_line()
    policy: Policy = WriteFilePolicy(FILENAME, line, harness.finish)
    if speaks is not None:
        policy = speaks(policy)
    started = time.monotonic()
    with _engine(mode, tokenizer, policy, backend, token_options) as engine, \
            running(engine, root / "run") as served:
        rollout = await open_rollout(served.url, {"harness": harness.name})
        try:
            output = await _run(harness, rollout, tools_dir, root, line, timeout, result)
        except SandboxError as exc:  # the machine's fault, not the harness's: this row only
            result.problems.append(f"infrastructure: {exc}")
            return result
        result.output = output[-4000:]
        result.seconds = time.monotonic() - started
        turns = served.store.turns(rollout["key"])
        _check_trace(harness, turns, result)
        try:
            result.drift.add(rollout["key"], turns, harness.name)
        except Exception as exc:  # the atlas's own fault: say so, keep the run's verdicts
            result.problems.append(f"drift atlas: {type(exc).__name__}: {exc}")
    return result


@contextlib.contextmanager
def _engine(mode: Mode, tokenizer: Any, policy: Policy, backend: Backend,
            token_options: dict[str, Any] | None = None) -> Iterator[Engine]:
    if mode == "chat":
        yield ScriptedEngine(tokenizer, policy, model=MODEL)
        return
    server = backend(tokenizer)
    with in_thread(server.app()) as (url, _server):
        options: dict[str, Any] = ({"tool_parser": "hermes"} if token_options is None
                                   else token_options)
        yield TokenEngine(url, tokenizer, extra_body=server.extra_body(policy), **options)


async def _run(harness: Harness, rollout: dict[str, Any], tools_dir: Path, root: Path,
               line: str, timeout: float, result: Result) -> str:
    # Confined as the runner confines it, so conformance proves the harness works there.
    limits = Limits(memory_bytes=harness.memory_bytes) if harness.memory_bytes else Limits()
    backend = registry.backend("local", BackendOptions(limits=limits,
                                                       confine=confinement_available()))
    sandbox = await backend.sandbox(root, f"sandbox-{harness.slug}")
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
    result.extension_rate = rollout_stats(turns).extension_rate
    # Token mode keeps the ids the model sampled in every later prompt: there, each turn
    # that continues a conversation extends it exactly, not just the tool-result turn.
    if result.mode == "token" and result.extension_rate not in (None, 1.0):
        result.problems.append(f"only {result.extension_rate:.0%} of the turns continuing a "
                               "conversation extend it token for token")


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
    """One row per variant, its runs in each mode side by side: chain extension and the
    verdict per mode; turns, tool calls and streaming once when the modes agree (else
    `chat / token`); seconds per mode; `-` for a mode not run."""
    rows = ["| harness | version | dialect | install s | streamed | turns | tool calls "
            "| chain chat | chain token | seconds (chat / token) | chat | token |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    by_variant: dict[str, dict[Mode, Result]] = {}
    for r in results:
        by_variant.setdefault(r.harness, {})[r.mode] = r
    return "\n".join([*rows, *map(_row, by_variant.values())]) + "\n"


def _row(runs: dict[Mode, Result]) -> str:
    first = next(iter(runs.values()))
    installs = [r.install_seconds for r in runs.values() if r.install_seconds is not None]
    cells = [first.harness, first.version, first.dialect,
             f"{installs[0]:.1f}" if installs else "cached",
             _per_mode(runs, lambda r: "yes" if r.streamed else "no"),
             _per_mode(runs, lambda r: str(r.turns)),
             _per_mode(runs, lambda r: f"{r.tool_calls} ({r.tool_call_source})"),
             *(_chain(runs.get(m)) for m in MODES),
             _per_mode(runs, lambda r: f"{r.seconds:.1f}", merge=False),
             *(_verdict(runs.get(m)) for m in MODES)]
    return "| " + " | ".join(cells) + " |"


def _per_mode(runs: dict[Mode, Result], cell: Callable[[Result], str], *,
              merge: bool = True) -> str:
    """`cell` of each mode's run, `chat / token`; once if every run agrees (`merge`)."""
    cells = [cell(runs[m]) if m in runs else "-" for m in MODES]
    ran = {c for m, c in zip(MODES, cells, strict=True) if m in runs}
    return ran.pop() if merge and len(ran) == 1 else " / ".join(cells)


def _chain(result: Result | None) -> str:
    if result is None:
        return "-"
    return {True: "yes", False: "no", None: "n/a"}[result.chain_extended]


def _verdict(result: Result | None) -> str:
    if result is None:
        return "-"
    return "PASS" if result.passed else "FAIL: " + "; ".join(result.problems)


def drift_markdown(results: list[Result]) -> str:
    """The drift atlas of a conformance run: one row per variant and mode (turns, the
    extension rate, rows the run makes, breaks by cause, calls by kind), then one example
    per cause and variant (both sides of the first difference)."""
    rows = ["| harness | mode | turns | ext. rate | rows | breaks by cause | calls by kind |",
            "|---|---|---|---|---|---|---|"]
    examples: list[str] = []
    for r in sorted(results, key=lambda r: (r.harness, MODES.index(r.mode))):
        d = r.drift
        rate = d.extension_rate
        rows.append(f"| {r.harness} | {r.mode} | {d.stats.turns} | "
                    f"{'-' if rate is None else f'{rate:.0%}'} | {d.stats.chains} | "
                    f"{_counts(d.causes)} | {_counts(d.kinds)} |")
        for cause, ex in sorted(d.examples.items()):
            examples.append(f"| {r.harness} | {r.mode} | {cause} | {ex['turn']} | "
                            f"{_cell(ex.get('old_text'))} | {_cell(ex.get('new_text'))} |")
    out = "\n".join(rows) + "\n"
    if examples:
        out += ("\n| harness | mode | cause | turn | the chain had | the prompt has |\n"
                "|---|---|---|---|---|---|\n" + "\n".join(examples) + "\n")
    return out


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(counts.items())) or "-"


def _cell(text: str | None, width: int = 80) -> str:
    if not text:
        return "-"
    flat = text.replace("|", "\\|").replace("\n", " ⏎ ").replace("`", "'")
    return flat if len(flat) <= width else flat[:width] + "…"


def policy_tokenizer(cache: Path = Path("~/.cache/harnessrl/models/tiny-qwen2")) -> Any:
    """The scripted policy speaks through the tiny model's tokenizer and template."""
    from transformers import AutoTokenizer

    from harnessrl.models.tiny import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model(cache.expanduser()))
