"""Per-harness evaluation: the statistics, the files, and two real harnesses side by side
(one solving with the oracle policy, one failing with a policy that never acts)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rich.console import Console

from harnessrl.harnesses import get
from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
from harnessrl.rollout.conformance import policy_tokenizer
from harnessrl.rollout.evaluate import (
    PlotUnavailable,
    evaluate,
    markdown,
    pass_at_k,
    plot,
    wilson,
    write_all,
)
from harnessrl.rollout.rewards import Shaping
from harnessrl.rollout.run import execute, oracle_policy
from harnessrl.rollout.runner import RunSettings
from harnessrl.rollout.tasks.task import load_tasks
from harnessrl.types import Outcome

TOOLS = Path("~/.cache/harnessrl/tools").expanduser()


def outcome(harness: str, task: str, sample: int, reward: float | None, **kw) -> Outcome:
    return Outcome(harness=harness, harness_version="1", task=task, sample=sample,
                   rollout=f"{harness}{task}{sample}", status="done" if reward is not None
                   else "infra_error", reward=reward, verifier_reward=reward, **kw)


def test_wilson_and_pass_at_k() -> None:
    low, high = wilson(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-3)
    low, high = wilson(8, 10)
    assert (low, high) == pytest.approx((0.4902, 0.9433), abs=1e-3)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 3, 2) == 1.0


def test_evaluate_counts_infra_errors_apart(tmp_path: Path) -> None:
    outcomes = [outcome("a", "t1", 0, 1.0, tool_calls=2, completion_tokens=100),
                outcome("a", "t1", 1, 0.0), outcome("a", "t2", 0, 1.0, tool_calls=4,
                                                    completion_tokens=300),
                outcome("a", "t2", 1, None), outcome("b", "t1", 0, 0.0)]
    a, b = evaluate(outcomes, k=1)
    assert (a.rollouts, a.passed, a.infra_errors) == (3, 2, 1)
    assert a.pass_rate == pytest.approx(2 / 3)
    assert a.tool_calls_per_solved == 3.0 and a.tokens_per_solved == 200.0
    assert a.pass_at_k == pytest.approx((0.5 + 1.0) / 2)
    assert b.pass_rate == 0.0 and b.tool_calls_per_solved is None
    md, csv_file, png = write_all([a, b], tmp_path)
    assert "| a | 1 | 2 | 3 | 2 | 67% (" in md.read_text()
    assert csv_file.read_text().splitlines()[0].startswith("harness,version")
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "pass@k" in markdown([a])


def test_without_matplotlib_the_tables_are_written_and_the_plot_skipped(
        tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    rows = evaluate([outcome("a", "t1", 0, 1.0)], k=1)
    with pytest.raises(PlotUnavailable, match=r"pip install 'harnessrl\[plot\]'"):
        plot(rows, tmp_path / "eval.png")
    assert write_all(rows, tmp_path) == [tmp_path / "eval.md", tmp_path / "eval.csv"]
    assert not (tmp_path / "eval.png").exists()
    assert "harnessrl[plot]" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.harness
def test_two_harnesses_one_solving_one_failing(tmp_path: Path) -> None:
    tasks = load_tasks("bundled:create-hello-file,is-palindrome")
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    tokenizer = policy_tokenizer()
    shaping = Shaping(fewer_tool_calls=0.1)
    solver, idler = get("mini-swe-agent"), get("pi")
    for harness in (solver, idler):
        harness.install(TOOLS, log=lambda _line: None)
    execute(RunSettings(harnesses=[solver], tasks=tasks, shaping=shaping),
            ScriptedEngine(tokenizer, oracle_policy(tasks)), tmp_path, console=quiet)
    outcomes = execute(
        RunSettings(harnesses=[idler], tasks=tasks, shaping=shaping),
        ScriptedEngine(tokenizer, replay(["I will not do anything."])), tmp_path,
        console=quiet)
    by_harness = {(o.harness, o.task): o for o in outcomes}
    for task in ("create-hello-file", "is-palindrome"):
        solved, failed = by_harness["mini-swe-agent", task], by_harness["pi", task]
        assert solved.reward == pytest.approx(1.09) and solved.shaping
        assert failed.status == "done" and failed.reward == 0.0 and failed.shaping == {}
        assert failed.tool_calls == 0 and failed.agent_finished is True
    rows = {r.harness: r for r in evaluate(outcomes, k=1)}
    assert rows["mini-swe-agent"].pass_rate == 1.0 and rows["pi"].pass_rate == 0.0
