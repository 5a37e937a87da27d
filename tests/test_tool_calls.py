"""Tool calls that mean the same in every harness (issue 15, item 5): native tool calls
where the rollout's calls offered tools, the harness's own action record where it acts on
text; and the reference's shaping form `correct * (1 + w * B/(B + tool calls))`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harnessrl.harnesses import get
from harnessrl.harnesses.base import RunContext
from harnessrl.rollout.rewards import Shaping, TraceStats
from harnessrl.rollout.tasks.task import Verdict
from tests.helpers import tool_turn as turn

OUTCOMES = Path(__file__).parent / "outcomes"
PASSED, FAILED = Verdict(1.0, True, "", 0.1), Verdict(0.0, False, "", 0.1)


# ------------------------------------------------------------------ which count
def test_a_harness_with_native_tools_is_counted_from_its_tool_calls() -> None:
    turns = [turn(0, tools=True, calls=2), turn(1, tools=True, calls=1),
             turn(2, tools=True, calls=0)]
    # Its own record does not override what the wire carries.
    stats = TraceStats.of(turns, executed=7)
    assert (stats.tool_calls, stats.tool_call_source) == (3, "native")
    assert (stats.turns, stats.completion_tokens) == (3, 9)
    assert TraceStats.of(turns) == stats


def test_a_harness_acting_on_text_is_counted_from_its_own_record() -> None:
    turns = [turn(0, tools=False, calls=0, text="hello.txt\n```\nhi\n```")]
    stats = TraceStats.of(turns, executed=2)
    assert (stats.tool_calls, stats.tool_call_source) == (2, "harness")
    # Without a record nothing is made up: no tool call was carried, none is counted.
    assert TraceStats.of(turns).tool_call_source == "native"
    assert TraceStats.of(turns).tool_calls == 0


def test_one_call_offering_tools_makes_the_rollout_native() -> None:
    turns = [turn(0, tools=False, calls=0), turn(1, tools=True, calls=1)]
    assert TraceStats.of(turns, executed=5).tool_call_source == "native"


# ------------------------------------------------------------------ the harnesses' records
def replay(name: str, case: str, tmp_path: Path):
    home = tmp_path / "home"
    shutil.copytree(OUTCOMES / name / case / "home", home)
    ctx = RunContext(home=home, workdir=tmp_path, proxy_root="http://127.0.0.1:9/r/k", key="k",
                     tools_dir=tmp_path)
    code = int((OUTCOMES / name / case / "exit_code").read_text())
    return get(name).outcome(ctx, code, b""), home


def test_mini_swe_agent_counts_the_commands_of_its_recorded_trajectory(tmp_path) -> None:
    """Recorded through the proxy with the scripted policy: it wrote the file with one
    command and submitted with a second (its two native tool calls)."""
    state, home = replay("mini-swe-agent", "success", tmp_path)
    assert state.finished and state.actions == 2
    trajectory = json.loads((home / "trajectory.json").read_text())
    commands = [a["command"] for m in trajectory["messages"] if m["role"] == "assistant"
                for a in m["extra"]["actions"]]
    assert commands[-1] == "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" and len(commands) == 2


def test_mini_swe_agent_without_a_model_reply_ran_nothing(tmp_path) -> None:
    state, _home = replay("mini-swe-agent", "failure", tmp_path)
    assert not state.finished and state.actions == 0


def test_a_trajectory_not_as_mini_swe_agent_writes_it_gives_no_count(tmp_path) -> None:
    """The agent can write over the file: a count is reported only from its own shape."""
    _state, home = replay("mini-swe-agent", "success", tmp_path)
    path = home / "trajectory.json"
    trajectory = json.loads(path.read_text())
    for broken in ({**trajectory, "messages": "gone"},
                   {**trajectory, "messages": [{"role": "assistant",
                                                "extra": {"actions": "ls"}}]}):
        path.write_text(json.dumps(broken))
        ctx = RunContext(home=home, workdir=tmp_path, proxy_root="http://x/r/k", key="k",
                         tools_dir=tmp_path)
        assert get("mini-swe-agent").outcome(ctx, 0, b"").actions is None


def test_aider_counts_the_edits_it_applied_and_nothing_without_a_history(tmp_path) -> None:
    ctx = RunContext(home=tmp_path, workdir=tmp_path, proxy_root="http://x/r/k", key="k",
                     tools_dir=tmp_path)
    aider = get("aider")
    aider.setup(ctx)
    state = tmp_path / ".aider-run"
    (state / "llm.history.txt").write_text(
        "TO LLM 2026-12-01T10:00:00\nUSER make two files\n"
        "LLM RESPONSE 2026-12-01T10:00:01\nASSISTANT a.txt\nASSISTANT ```\n")
    assert aider.outcome(ctx, 0, b"").actions is None  # no chat history: not known
    (state / "chat.history.md").write_text(
        "#### make two files\n\n> Applied edit to a.txt\n> Applied edit to b.txt\n")
    assert aider.outcome(ctx, 0, b"").actions == 2


# ------------------------------------------------------------------ the reference's form
@pytest.mark.parametrize(("calls", "expected"), [(0, 1.5), (4, 1.25), (12, 1.125)])
def test_the_tool_call_bonus_is_the_references_form(calls: int, expected: float) -> None:
    shaping = Shaping(tool_call_bonus=0.5, tool_call_budget=4)
    stats = TraceStats(turns=calls + 1, tool_calls=calls, completion_tokens=10)
    reward, terms = shaping.reward(PASSED, stats)
    assert reward == pytest.approx(1.0 * (1 + 0.5 * 4 / (4 + calls))) == pytest.approx(expected)
    assert terms == {"tool_call_bonus": pytest.approx(expected - 1.0)}


def test_the_tool_call_bonus_is_only_for_a_correct_answer() -> None:
    shaping = Shaping(tool_call_bonus=0.5, tool_call_budget=4, fewer_tool_calls=0.1)
    reward, terms = shaping.reward(FAILED, TraceStats(turns=1, tool_calls=0,
                                                      completion_tokens=1))
    assert (reward, terms) == (0.0, {})


def test_the_tool_call_bonus_needs_a_budget_of_at_least_one() -> None:
    with pytest.raises(ValueError, match="tool_call_budget"):
        Shaping(tool_call_bonus=0.5, tool_call_budget=0)
    assert Shaping(fewer_tool_calls=0.1, tool_call_budget=0).fewer_tool_calls == 0.1
