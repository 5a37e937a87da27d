"""The runner end to end: a real harness on bundled tasks through the proxy, driven by the
oracle policy (each task's reference solution through the harness's own shell tool)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from rich.console import Console

from harnessrl.errors import EngineUnavailable
from harnessrl.harnesses import get
from harnessrl.proxy.engines.scripted import ScriptedEngine
from harnessrl.rollout.conformance import policy_tokenizer
from harnessrl.rollout.rewards import Shaping, TraceStats
from harnessrl.rollout.run import execute, oracle_policy
from harnessrl.rollout.runner import RolloutSettings, RunSettings
from harnessrl.rollout.tasks.task import Verdict, load_tasks
from harnessrl.store.reader import TraceReader

TOOLS = Path("~/.cache/harnessrl/tools").expanduser()


def flat(_verdict: Verdict, _stats: TraceStats) -> float:
    """A custom shaping term (`module:function`) for the test below."""
    return -0.05


def test_shaping_terms_are_recorded_apart_and_only_for_passes() -> None:
    shaping = Shaping(fewer_tool_calls=0.2, tool_call_budget=10, fewer_tokens=0.1,
                      token_budget=1000, custom=("tests.test_runner:flat",))
    stats = TraceStats(turns=3, tool_calls=2, completion_tokens=250)
    passed = Verdict(1.0, True, "", 0.1)
    reward, terms = shaping.reward(passed, stats)
    assert terms == pytest.approx({"fewer_tool_calls": 0.16, "fewer_tokens": 0.075,
                                   "flat": -0.05})
    assert reward == pytest.approx(1.0 + 0.16 + 0.075 - 0.05)
    reward, terms = shaping.reward(Verdict(0.0, False, "", 0.1), stats)
    assert terms == {"flat": -0.05} and reward == pytest.approx(-0.05)


@pytest.fixture(scope="module")
def mini():
    harness = get("mini-swe-agent")
    harness.install(TOOLS, log=lambda _line: None)
    return harness


@pytest.mark.slow
@pytest.mark.harness
def test_oracle_run_scores_every_rollout_and_resumes_without_duplicates(mini, tmp_path):
    tasks = load_tasks("bundled:create-hello-file,fizzbuzz,rename-extensions")
    config = RunSettings(harnesses=[mini], tasks=tasks, samples=2,
                       settings=RolloutSettings(concurrency=2),
                       shaping=Shaping(fewer_tool_calls=0.1))
    engine = ScriptedEngine(policy_tokenizer(), oracle_policy(tasks), model="oracle")
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    outcomes = execute(config, engine, tmp_path, console=quiet)
    assert len(outcomes) == 6 and all(o.status == "done" for o in outcomes)
    assert all(o.verifier_reward == 1.0 and o.reward == pytest.approx(1.09) for o in outcomes)
    assert all(o.shaping == {"fewer_tool_calls": pytest.approx(0.09)} for o in outcomes)
    with TraceReader(tmp_path) as store:
        turns_before = store.count_turns()
        assert turns_before == 12 and all(store.turns(o.rollout) for o in outcomes)

    again = execute(config, engine, tmp_path, console=quiet)  # resume: nothing left to do
    with TraceReader(tmp_path) as store:
        assert store.count_turns() == turns_before and len(again) == 6


@pytest.mark.slow
@pytest.mark.harness
def test_engine_failure_is_an_infra_error_without_a_reward(mini, tmp_path):
    def down(_request):
        raise EngineUnavailable("the engine is down (test)")

    tasks = load_tasks("bundled:create-hello-file")
    config = RunSettings(harnesses=[mini], tasks=tasks, settings=RolloutSettings(retries=1))
    engine = ScriptedEngine(policy_tokenizer(), down, model="down")
    [outcome] = execute(config, engine, tmp_path, console=Console(file=open("/dev/null", "w")))  # noqa: SIM115
    assert outcome.status == "infra_error" and outcome.reward is None
    assert outcome.attempts == 2 and "engine" in outcome.error


def test_plan_interleaves_harnesses_and_skips_done() -> None:
    from harnessrl.rollout.runner import plan

    tasks = load_tasks("bundled:fizzbuzz,is-palindrome")
    harnesses = [get("mini-swe-agent"), get("opencode"), get("claude")]
    todo = plan(RunSettings(harnesses=harnesses, tasks=tasks, samples=2),
                done={("mini-swe-agent", "fizzbuzz", 1), ("opencode", "is-palindrome", 0)})
    # Each (task, sample) is handed to every harness in turn before the next one, so
    # running the plan in order keeps the harnesses side by side; done ones are left out.
    assert [(p.harness.name, p.task.id, p.sample) for p in todo] == [
        ("mini-swe-agent", "fizzbuzz", 0), ("opencode", "fizzbuzz", 0),
        ("claude", "fizzbuzz", 0),
        ("opencode", "fizzbuzz", 1), ("claude", "fizzbuzz", 1),
        ("mini-swe-agent", "is-palindrome", 0), ("claude", "is-palindrome", 0),
        ("mini-swe-agent", "is-palindrome", 1), ("opencode", "is-palindrome", 1),
        ("claude", "is-palindrome", 1)]


@pytest.mark.slow
@pytest.mark.harness
def test_agent_cannot_see_tests_solution_or_other_rollouts(mini, tmp_path):
    from harnessrl.proxy.engines.policy import OraclePolicy
    from harnessrl.types import ToolResult

    [task] = load_tasks("bundled:fizzbuzz")
    snoop = (f"ls -A {task.source} {task.source}/tests {tmp_path / 'sandboxes'}; "
             f"cat {task.source}/solution/solve.sh; echo SNOOPED")
    policy = OraclePolicy({task.instruction.strip().splitlines()[0][:100]: snoop})
    config = RunSettings(harnesses=[mini], tasks=[task], samples=2,
                       settings=RolloutSettings(concurrency=2))
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    outcomes = execute(config, ScriptedEngine(policy_tokenizer(), policy), tmp_path,
                       console=quiet)
    with TraceReader(tmp_path) as store:
        seen = [part for o in outcomes for turn in store.turns(o.rollout) if turn.request
                for m in turn.request.messages for part in m.parts
                if isinstance(part, ToolResult)]
    text = " ".join(p.content[0].text for p in seen)
    assert text.count("SNOOPED") == 2  # the command ran in both rollouts
    # The task's directory is empty for the agent: no test file listed, no solution read.
    assert "test_outputs.py" not in text and "HARNESSRL_EOF" not in text
    assert "No such file" in text
    for part in seen:  # each rollout sees its own sandbox, never the other one
        assert part.content[0].text.count("mini-swe-agent.fizzbuzz.") <= 1


def test_a_harness_that_never_calls_the_model_is_an_infra_error(tmp_path):
    """Hanging or exiting before the first model call is the harness's failure, not the
    policy's: no reward, the reason (with its stderr) kept, the whole process tree killed."""
    import json
    import subprocess

    from harnessrl.harnesses.base import Harness
    from harnessrl.proxy.engines.scripted import replay

    class Hangs(Harness):
        def executable(self, tools_dir: Path) -> Path:
            return Path("/bin/sh")

    def shell(name: str, script: str) -> Harness:
        return Hangs(name=name, version="0", dialect="openai_chat", registry="npm",
                     package="-", binary="sh", argv=lambda ctx, instruction: ["-c", script])

    (tmp_path / "tasks.jsonl").write_text(json.dumps(
        {"id": "hang", "instruction": "wait", "verify": ["test -f done.txt"], "timeout": 2}))
    config = RunSettings(harnesses=[shell("hangs", "sleep 983.5 & sleep 983.6"),
                                  shell("crashes", "echo 'no config found' >&2; exit 3")],
                       tasks=load_tasks(tmp_path / "tasks.jsonl"),
                       settings=RolloutSettings(retries=0))
    engine = ScriptedEngine(policy_tokenizer(), replay(["unused"]))
    outcomes = execute(config, engine, tmp_path / "run",
                       console=Console(file=open("/dev/null", "w")))  # noqa: SIM115
    by_name = {o.harness: o for o in outcomes}
    assert all(o.status == "infra_error" and o.reward is None for o in outcomes)
    assert "hangs timed out before its first model call" in str(by_name["hangs"].error)
    assert "crashes exited 3 before its first model call: no config found" in str(
        by_name["crashes"].error)
    alive = subprocess.run(["pgrep", "-f", "sleep 983"], capture_output=True, text=True)
    assert alive.stdout == ""  # the whole process tree is gone


@pytest.mark.slow
@pytest.mark.harness
def test_an_oracle_that_does_not_pass_is_a_broken_pipeline(mini, tmp_path, monkeypatch):
    """A verifier that cannot run is an infrastructure error, and an oracle rollout that is
    scored but fails names the pipeline, not the model."""
    from harnessrl.rollout.run import oracle_check
    from harnessrl.rollout.tasks import task as tasks_module

    good, wrong = load_tasks("bundled:create-hello-file,fizzbuzz")
    wrong = dataclasses.replace(wrong, solution_dir=None, solution_commands=("true",))
    config = RunSettings(harnesses=[mini], tasks=[good, wrong],
                       settings=RolloutSettings(retries=0))
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    [problem] = oracle_check(config, tmp_path / "scored", console=quiet)
    assert problem.startswith("mini-swe-agent on fizzbuzz (sample 0): the reference "
                              "solution did not pass (verifier scored, reward 0.0")

    env = tasks_module.Layout.env
    monkeypatch.setattr(tasks_module.Layout, "env",
                        lambda self: env(self) | {"PYTHON": "/nonexistent/python"})
    problems = oracle_check(dataclasses.replace(config, tasks=[good]), tmp_path / "broken",
                            console=quiet)
    assert len(problems) == 1 and "infrastructure error" in problems[0]
    assert "/nonexistent/python" in problems[0] and "verifier" in problems[0]


@pytest.mark.slow
@pytest.mark.harness
def test_a_rollout_stopped_at_its_step_cap_is_scored_and_marked_capped(mini, tmp_path):
    """The oracle writes the file with its first call; the cap of one refuses the second
    (the submit), in mini-swe-agent's own dialect, so it stops unfinished. The verifier
    scores what it left (the file is there): a result, not an infrastructure error."""
    tasks = load_tasks("bundled:create-hello-file")
    config = RunSettings(harnesses=[mini], tasks=tasks,
                       settings=RolloutSettings(retries=0, max_model_calls=1),
                       shaping=Shaping(tool_call_bonus=0.5, tool_call_budget=4))
    engine = ScriptedEngine(policy_tokenizer(), oracle_policy(tasks), model="oracle")
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    [outcome] = execute(config, engine, tmp_path, console=quiet)
    assert outcome.status == "done" and outcome.capped and outcome.error is None
    assert outcome.verifier_reward == 1.0 and outcome.agent_finished is False
    assert (outcome.tool_calls, outcome.tool_call_source) == (1, "native")
    assert outcome.shaping == {"tool_call_bonus": pytest.approx(0.5 * 4 / 5)}
    assert outcome.reward == pytest.approx(1.0 * (1 + 0.5 * 4 / 5))
    with TraceReader(tmp_path) as store:
        turns = store.turns(outcome.rollout)
        assert store.rollout(outcome.rollout).max_model_calls == 1
    assert turns[0].status == "ok" and len(turns) >= 2 and outcome.turns == len(turns)
    assert all(t.error_kind == "step_cap" and t.completion is None for t in turns[1:])
    from harnessrl.rollout.evaluate import evaluate

    [row] = evaluate([outcome], k=1)
    assert row.capped == 1 and row.infra_errors == 0 and row.passed == 1


@pytest.mark.slow
@pytest.mark.harness
def test_a_harness_acting_on_text_counts_its_own_edits(tmp_path):
    """aider offers the model no tools: its tool calls are the edits it applied, from its
    chat history (the whole-file oracle writes each file the solution writes, here
    hello.txt and out/.keep, in one reply), not the wire's zero."""
    from harnessrl.rollout.run import oracle_engine

    aider = get("aider")
    aider.install(TOOLS, log=lambda _line: None)
    tasks = load_tasks("bundled:create-hello-file")
    [written] = oracle_policy(tasks, listings=True).listings.values()
    config = RunSettings(harnesses=[aider], tasks=tasks, settings=RolloutSettings(retries=0))
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    [outcome] = execute(config, oracle_engine(tasks, [aider]), tmp_path, console=quiet)
    assert outcome.status == "done" and outcome.verifier_reward == 1.0, outcome
    assert len(written) == 2 and outcome.turns == 1
    assert (outcome.tool_calls, outcome.tool_call_source) == (len(written), "harness")
    assert not outcome.capped
    with TraceReader(tmp_path) as store:
        turns = store.turns(outcome.rollout)
    assert sum(len(t.completion.tool_calls) for t in turns if t.completion) == 0


def test_an_agent_waiting_on_the_trainer_is_not_out_of_time(tmp_path):
    """The colocated schedule closes the proxy's gate for a whole optimizer step, longer
    than a task's agent timeout here: the agent's one model call waits that out, and the
    seconds the gate was closed do not count against it. Before, the agent was killed
    while it waited: its rollout failed (retried, or an infrastructure error), or with
    turns already sampled it was scored as timed out for the trainer's time."""
    import asyncio
    import json
    import sys
    import textwrap
    import threading

    from harnessrl.harnesses.base import Harness
    from harnessrl.proxy.engines.scripted import replay
    from harnessrl.rollout.serving import serving

    class Asks(Harness):
        def executable(self, tools_dir: Path) -> Path:
            return Path(sys.executable)

    ask = textwrap.dedent("""
        import json, os, urllib.request
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        head = {"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["KEY"]}
        url = os.environ["BASE"] + "/chat/completions"
        req = urllib.request.Request(url, json.dumps(body).encode(), head)
        reply = json.load(urllib.request.urlopen(req, timeout=60))
        open("done.txt", "w").write(reply["choices"][0]["message"]["content"])
    """)
    harness = Asks(name="asks", version="0", dialect="openai_chat", registry="pypi",
                   package="-", binary="python", argv=lambda ctx, _i: ["-c", ask],
                   env=lambda ctx: {"BASE": ctx.openai_base, "KEY": ctx.key})
    (tmp_path / "tasks.jsonl").write_text(json.dumps(
        {"id": "wait", "instruction": "ask once", "verify": ["test -f done.txt"],
         "timeout": 2}))
    config = RunSettings(harnesses=[harness], tasks=load_tasks(tmp_path / "tasks.jsonl"),
                         settings=RolloutSettings(retries=0, hide_host=False))
    engine = ScriptedEngine(policy_tokenizer(), replay(["yes"]))
    with serving(config, engine, tmp_path / "run") as served:
        gate = served.proxy.gate
        gate.close()  # an optimizer step of 4 s, twice the agent's 2 s
        threading.Timer(4.0, gate.open).start()
        [outcome] = asyncio.run(served.runner.run(served.runner.pending()))
    assert outcome.status == "done" and not outcome.agent_timed_out, outcome.error
    assert outcome.verifier_reward == 1.0 and outcome.timings["agent"] >= 4.0
    assert gate.paused_seconds() >= 4.0
