"""The conformance matrix (issue 18, item 3): install time (or `cached`, never a made-up
figure), tool calls with where they were counted, and the rest of each variant's row.
Hand-built results and turns; no harness runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

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
                      "tool calls", "chain extended", "seconds", "pass"]
    assert first == ["pi", "1.2.3", "openai_chat", "41.3", "yes", "3", "2 (native)", "yes",
                     "7.0", "PASS"]
    assert second == ["pi@anthropic", "1.2.3", "anthropic", "cached", "no", "1",
                      "1 (harness)", "n/a", "3.0", "FAIL: hello.txt was not created"]


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
