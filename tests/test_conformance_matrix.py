"""The conformance matrix (issue 18, item 3): install time (or `cached`, never a made-up
figure), tool calls with where they were counted, and the rest of each variant's row.
Hand-built results and turns; no harness runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from msgspec.structs import replace

from harnessrl.harnesses import get
from harnessrl.harnesses.base import Harness
from harnessrl.rollout.conformance import Result, _check_trace, install_timed, matrix_markdown
from tests.helpers import tool_turn as turn


def rows(markdown: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")]
            for line in markdown.splitlines()]


def test_the_matrix_shows_install_time_and_tool_calls() -> None:
    fresh = Result("pi", "1.2.3", "openai_chat", streamed=True, turns=3, tool_calls=2,
                   chain_extended=True, install_seconds=41.26, seconds=7.0)
    cached = Result("pi@anthropic", "1.2.3", "anthropic", turns=1, tool_calls=1,
                    tool_call_source="harness", chain_extended=None, seconds=3.0,
                    problems=["hello.txt was not created"])
    header, _rule, first, second = rows(matrix_markdown([fresh, cached]))
    assert header == ["harness", "version", "dialect", "install s", "streamed", "turns",
                      "tool calls", "chain chat", "chain token", "seconds (chat / token)",
                      "chat", "token"]
    assert first == ["pi", "1.2.3", "openai_chat", "41.3", "yes", "3", "2 (native)", "yes",
                     "-", "7.0 / -", "PASS", "-"]
    assert second == ["pi@anthropic", "1.2.3", "anthropic", "cached", "no", "1",
                      "1 (harness)", "n/a", "-", "3.0 / -", "FAIL: hello.txt was not created",
                      "-"]


def test_a_variant_run_in_both_modes_is_one_row_with_a_column_pair_per_mode() -> None:
    chat = Result("grok", "0.0.34", "openai_chat", "chat", turns=2, tool_calls=1,
                  chain_extended=True, install_seconds=12.0, seconds=16.5)
    token = Result("grok", "0.0.34", "openai_chat", "token", turns=3, tool_calls=1,
                   chain_extended=False, seconds=14.25,
                   problems=["the turn carrying the tool result does not extend the call"])
    only_token = Result("droid", "0.225.2", "openai_chat", "token", streamed=True, turns=2,
                        tool_calls=1, chain_extended=True, seconds=9.0)
    _header, _rule, both, alone = rows(matrix_markdown([chat, token, only_token]))
    # the modes agree on streaming and tool calls (one figure), not on turns (both shown)
    assert both == ["grok", "0.0.34", "openai_chat", "12.0", "no", "2 / 3", "1 (native)",
                    "yes", "no", "16.5 / 14.2", "PASS",
                    "FAIL: the turn carrying the tool result does not extend the call"]
    assert alone == ["droid", "0.225.2", "openai_chat", "cached", "yes", "2", "1 (native)",
                     "-", "yes", "- / 9.0", "-", "PASS"]


def test_token_mode_wants_every_continuing_turn_to_extend_exactly() -> None:
    """A turn that continues the conversation with other ids than it was given is a
    problem in token mode (where ids are kept), not in chat mode."""
    harness = get("pi")
    call, result = turn(0, tools=True, calls=1), turn(1, tools=True, calls=0)
    assert result.completion is not None
    tokens = replace(result.completion.tokens, prompt_ids=(1, 2, 9, 9, 9, 7))
    rewritten = replace(result, completion=replace(result.completion, tokens=tokens))
    for mode, expected in (("chat", []), ("token", ["only 0% of the turns continuing a "
                                                     "conversation extend it token for token"])):
        checked = Result(harness.name, harness.version, "openai_chat", mode)
        _check_trace(harness, [call, rewritten], checked)
        assert checked.extension_rate == 0.0 and checked.problems == expected, mode


def test_tool_calls_are_counted_from_the_stored_turns() -> None:
    harness = get("pi")
    native = Result(harness.name, harness.version, "openai_chat", harness_actions=9)
    _check_trace(harness, [turn(0, tools=True, calls=2), turn(1, tools=True, calls=0)], native)
    assert (native.tool_calls, native.tool_call_source) == (2, "native")
    # no call offered a tool: the harness's own record counts, as in an Outcome
    text = Result(harness.name, harness.version, "openai_chat", harness_actions=1)
    _check_trace(harness, [turn(0, tools=False, calls=0)], text)
    assert (text.tool_calls, text.tool_call_source) == (1, "harness")


@dataclasses.dataclass(frozen=True)
class _SlowInstall(Harness):
    """A harness whose install is one real subprocess that takes a while."""

    def _install_commands(self, prefix: Path) -> list[list[str]]:
        exe = self.executable(prefix.parent.parent)
        return [["sh", "-c", f"sleep 0.3 && mkdir -p {exe.parent} && touch {exe}"]]


def test_install_time_is_measured_only_when_this_run_installs(tmp_path: Path) -> None:
    base = get("pi")
    harness = _SlowInstall(**{f.name: getattr(base, f.name)
                              for f in dataclasses.fields(base)})
    assert not harness.installed(tmp_path)
    seconds = install_timed(harness, tmp_path)
    assert seconds is not None and 0.3 <= seconds < 30
    assert harness.installed(tmp_path)
    assert install_timed(harness, tmp_path) is None  # cached: no figure


def test_conformance_refuses_an_unknown_mode(capsys) -> None:
    from harnessrl.cli import main

    assert main(["conformance", "--mode", "chat,tokens", "pi"]) == 2
    assert "--mode takes chat, token" in capsys.readouterr().err


def test_a_sandbox_that_cannot_start_fails_its_row_and_says_why(tmp_path, monkeypatch):
    """A broken machine (the sandbox's self-check fails) is that row's infrastructure
    problem, named, and the matrix goes on: it does not end the conformance run."""
    import asyncio

    from harnessrl.rollout import conformance
    from harnessrl.rollout.sandbox.base import SandboxError

    class Broken:
        async def sandbox(self, *_args, **_kwargs):
            raise SandboxError("the sandbox failed its self-check (exit 1)")

    monkeypatch.setattr(conformance.registry, "backend", lambda *_a, **_k: Broken())
    result = asyncio.run(conformance.check(get("pi"), tokenizer=conformance.policy_tokenizer(),
                                           tools_dir=tmp_path / "tools", root=tmp_path))
    assert not result.passed
    assert result.problems == ["infrastructure: the sandbox failed its self-check (exit 1)"]
