"""The oracle policy finds each task's reference solution however a harness hands the
model the instruction, and OpenCode and Kilo hand it over as written (issue 13): both
real CLIs pass every bundled task with the oracle, and aider (which only writes files)
every one that needs no file deleted."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from harnessrl.harnesses import get
from harnessrl.harnesses.base import RunContext
from harnessrl.proxy.engines.policy import WHOLE_FILE_MARKER, OraclePolicy
from harnessrl.proxy.engines.token.parsers import HermesParser
from harnessrl.rollout.run import oracle_check, oracle_policy, written_by_solution
from harnessrl.rollout.runner import RolloutSettings, RunSettings
from harnessrl.rollout.tasks.task import load_tasks
from harnessrl.types import ChatRequest, Message, Text, Tool

TOOLS = Path("~/.cache/harnessrl/tools").expanduser()
SHELL = Tool("bash", None, {"type": "object", "properties": {"command": {"type": "string"}},
                            "required": ["command"]})
FIRST_LINE = 'Edit `config.json`: set `"debug"` to `true`, set `"version"` to `"1.2.0"`, and add'


def _commands(policy: OraclePolicy, text: str) -> list[str]:
    request = ChatRequest(model="m", tools=(SHELL,),
                          messages=(Message("user", (Text(text),)),))
    parser = HermesParser()
    deltas = parser.feed(policy(request).text) + parser.finish()
    return [json.loads(d.arguments)["command"] for d in deltas if hasattr(d, "index")]


@pytest.mark.parametrize("shown", [
    FIRST_LINE,
    json.dumps(FIRST_LINE),  # OpenCode and Kilo before: quoted, inner quotes escaped
    "<task>\n" + FIRST_LINE.replace(" ", "\n") + "\n</task>",  # wrapped and reflowed
])
def test_the_oracle_knows_the_task_however_the_instruction_is_quoted(shown) -> None:
    policy = OraclePolicy({FIRST_LINE: "solve json", "Implement `fizzbuzz(n)`": "solve fizz"})
    assert _commands(policy, shown) == ["solve json"]


def test_a_harness_that_only_writes_files_gets_them_listed_whole() -> None:
    policy = OraclePolicy({"Make the files": "script"},
                          {"Make the files": {"a/b.py": "x = 1\n", "e": "", "f.md": "```\n"}})
    request = ChatRequest(model="m", messages=(
        Message("system", (Text(f"Use this {WHOLE_FILE_MARKER} format"),)),
        Message("user", (Text("Make the files"),))))
    reply = policy(request).text
    assert "a/b.py\n```\nx = 1\n```\n" in reply and "e\n```\n```\n" in reply
    assert "f.md\n````\n```\n````\n" in reply  # a fence longer than the backticks inside
    side = ChatRequest(model="m", messages=(Message("user", (Text("Make the files"),)),))
    assert policy(side).text == "Working on it."  # a title call, say: not aider's format


def test_the_files_a_solution_writes_are_found_by_running_it(tmp_path) -> None:
    [task] = load_tasks("bundled:create-hello-file")
    written = asyncio.run(written_by_solution(task, tmp_path, "oracle"))
    assert written == {"hello.txt": "Hello, world!\n", "out/.keep": ""}


def test_the_longest_matching_instruction_wins_and_an_unknown_one_gets_no_call() -> None:
    policy = OraclePolicy({"Fix the bug": "short", "Fix the bug in `a.py`": "long"})
    assert _commands(policy, "Fix the bug in `a.py` now") == ["long"]
    assert _commands(policy, "Write a title for this session") == []


def test_every_bundled_task_gets_its_own_solution() -> None:
    tasks = load_tasks("bundled")
    policy = oracle_policy(tasks)
    scripts = [_commands(policy, t.instruction) for t in tasks]
    assert all(len(s) == 1 for s in scripts)
    assert len({s[0] for s in scripts}) == len(tasks)  # no task answered with another's


FAKE = """#!/bin/sh
cat > "$(dirname "$0")/stdin"
for arg in "$@"; do printf '%s\\0' "$arg"; done > "$(dirname "$0")/args"
"""


@pytest.mark.parametrize("name", ["opencode", "kilo"])
def test_opencode_and_kilo_are_handed_the_instruction_as_written(name, tmp_path) -> None:
    """OpenCode reads it on stdin (a shell pipes it in, the sandbox's stdin being
    /dev/null); Kilo takes it whole after `--`. A stand-in binary records what it got."""
    harness = get(name)
    binary = harness.executable(tmp_path)
    binary.parent.mkdir(parents=True)
    binary.write_text(FAKE)
    binary.chmod(0o755)
    text = 'set `"debug"` to 1  -k --x\n-- "y" \\ z $HOME `id`'
    ctx = RunContext(home=tmp_path, workdir=tmp_path, proxy_root="http://p/r/k", key="k",
                     tools_dir=tmp_path)
    subprocess.run(harness.command(ctx, text), check=True, stdin=subprocess.DEVNULL)
    args = (binary.parent / "args").read_bytes().decode().split("\0")[:-1]
    stdin = (binary.parent / "stdin").read_text()
    if name == "opencode":
        assert stdin == text and text not in args and args[0] == "run"
    else:
        assert stdin == "" and args[args.index("--") + 1:] == [text]


# aider runs no command (its --yes-always says no to shell commands) and its edits only
# write files: a solution that deletes or renames one cannot be expressed.
CANNOT = {"aider": {"refactor-split-utils", "rename-extensions"}}


# Each sweeps the bundled tasks whose instructions carry the most quotes, backticks and
# `$`, the characters a harness's own quoting mangled: OpenCode twelve, Kilo and aider
# eight (all 32 take 3, 6 and 5 minutes on this box). HARNESSRL_FULL_SWEEP=1 runs all 32.
SAMPLED = {"opencode": 12, "kilo": 8, "aider": 8}


def _sweep(name: str) -> list:
    tasks = load_tasks("bundled")
    if os.environ.get("HARNESSRL_FULL_SWEEP") == "1" or name not in SAMPLED:
        return tasks
    def quoting(task) -> int:
        return sum(task.instruction.count(c) for c in '"`$\\')
    return sorted(tasks, key=quoting, reverse=True)[:SAMPLED[name]]


@pytest.mark.slow
@pytest.mark.harness
@pytest.mark.parametrize("name", ["opencode", "kilo", "aider"])
def test_the_oracle_passes_every_bundled_task(name, tmp_path) -> None:
    harness = get(name)
    harness.install(TOOLS, log=lambda _line: None)
    tasks = _sweep(name)
    config = RunSettings(harnesses=[harness], tasks=tasks,
                       settings=RolloutSettings(concurrency=2, tools_dir=str(TOOLS)))
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    problems = oracle_check(config, tmp_path / "run", console=quiet)
    failed = {p.removeprefix(f"{name} on ").split(" ")[0] for p in problems}
    cannot = CANNOT.get(name, set()) & {t.id for t in tasks}
    assert failed == cannot, "\n".join(problems)
