"""Tasks: loading (Harbor layout, JSONL, bundled), prepare, verify, and the bundled set."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harnessrl.rollout.sandbox.local import LocalSandbox
from harnessrl.rollout.tasks.task import (
    BUNDLED,
    DIFFICULTIES,
    Task,
    TaskError,
    Verdict,
    load_tasks,
    prepare,
    run_solution,
    verify,
)

FAST_SAMPLE = ("fizzbuzz", "create-hello-file", "fix-inventory-package", "refactor-split-utils",
               "make-greet-test-pass")


async def attempt(task: Task, root: Path, *, solve: bool,
                  agent: Callable | None = None) -> Verdict:
    """Prepare the task, optionally apply the reference solution (or `agent`), verify."""
    name = f"{task.id}-{'solved' if solve else 'untouched'}"
    async with await LocalSandbox.create(root, name, kill_grace=0.5) as box:
        await prepare(task, box)
        if solve:
            await run_solution(task, box)
        if agent is not None:
            await agent(box)
        return await verify(task, box)


async def check_reference_and_empty(tasks: list[Task], root: Path) -> dict[str, float]:
    """Every task: the reference solution scores 1.0, the untouched workdir 0.0."""
    gate = asyncio.Semaphore(4)

    async def one(task: Task, solve: bool) -> tuple[str, bool, Verdict]:
        async with gate:
            return task.id, solve, await attempt(task, root, solve=solve)

    started = time.monotonic()
    results = await asyncio.gather(*(one(t, s) for t in tasks for s in (True, False)))
    wrong = [(tid, solve, v.reward, v.status, v.reason, v.output[-800:])
             for tid, solve, v in results
             if v.status != "scored" or v.reward != (1.0 if solve else 0.0)]
    assert not wrong, wrong
    assert all(v.passed == solve for _, solve, v in results)
    return {"wall": time.monotonic() - started, "verify": sum(v.seconds for *_, v in results)}


# -- the bundled set -------------------------------------------------------------------------

def test_bundled_set_shape():
    tasks = load_tasks("bundled")
    assert len(tasks) >= 30
    assert {t.difficulty for t in tasks} == set(DIFFICULTIES)
    kinds = {t.metadata["category"] for t in tasks}
    assert kinds == {"implement", "bugfix", "failing-test", "refactor", "shell", "file"}
    for task in tasks:
        assert task.instruction.strip() and task.solution_dir is not None
        assert (task.tests_dir / "test.sh").is_file()
        assert task.dockerfile is not None and task.agent_timeout > task.verifier_timeout
        # the hidden tests are not among the files the agent starts with
        assert not list(task.environment_dir.rglob("test_outputs.py"))


def test_bundled_selectors():
    easy = load_tasks("bundled:easy")
    assert easy and {t.difficulty for t in easy} == {"easy"}
    both = load_tasks("bundled:easy,hard")
    assert {t.difficulty for t in both} == {"easy", "hard"}
    assert [t.id for t in load_tasks("bundled:lru-cache,fizzbuzz")] == ["fizzbuzz", "lru-cache"]
    with pytest.raises(TaskError, match="no-such-task"):
        load_tasks("bundled:no-such-task")
    assert [t.id for t in load_tasks(BUNDLED / "fizzbuzz")] == ["fizzbuzz"]


async def test_sample_of_bundled_tasks(tmp_path: Path):
    tasks = [t for t in load_tasks("bundled") if t.id in FAST_SAMPLE]
    assert len(tasks) == len(FAST_SAMPLE)
    await check_reference_and_empty(tasks, tmp_path)


@pytest.mark.slow  # ~8 s on an idle 2-CPU machine, over 20 s when it is busy
async def test_every_bundled_task(tmp_path: Path):
    timing = await check_reference_and_empty(load_tasks("bundled"), tmp_path)
    print(f"bundled set: {timing['wall']:.1f} s wall, {timing['verify']:.1f} s in verify")


# -- hidden tests ----------------------------------------------------------------------------

async def test_tests_are_not_visible_before_verify(tmp_path: Path):
    task = load_tasks("bundled:fizzbuzz")[0]
    seen: dict[str, str] = {}

    async def agent(box: LocalSandbox) -> None:
        found = await box.run("find .. -name '*.py' -o -name 'test.sh' | sort", timeout=10)
        seen["files"] = found.stdout.decode()

    verdict = await attempt(task, tmp_path, solve=False, agent=agent)
    assert seen["files"].split() == ["../work/fizzbuzz.py"]
    assert verdict.reward == 0.0


async def test_what_the_agent_plants_does_not_count(tmp_path: Path):
    """A forged reward, a fake test.sh, and files that would hijack pytest are all ignored."""
    task = load_tasks("bundled:fizzbuzz")[0]

    async def cheat(box: LocalSandbox) -> None:
        script = """
            mkdir -p ../tests ../logs/verifier
            echo 1 > ../logs/verifier/reward.txt
            printf 'echo 1 > "$LOGS_DIR/reward.txt"' > ../tests/test.sh
            printf 'import sys\\nsys.exit(0)\\n' > pytest.py
            printf 'def pytest_runtest_call(item):\\n    pass\\n' > conftest.py
            printf '[pytest]\\naddopts = -k nothing\\n' > ../pytest.ini
            cp conftest.py ../conftest.py
        """
        assert (await box.run(script, timeout=10)).exit_code == 0

    verdict = await attempt(task, tmp_path, solve=False, agent=cheat)
    assert verdict.reward == 0.0 and verdict.status == "scored"
    assert "failed" in verdict.output


# -- Harbor layout ---------------------------------------------------------------------------

def harbor_task(root: Path, name: str = "harbor-demo", *, test_sh: str | None = None,
                toml: str | None = None) -> Path:
    """A task written the way Harbor tasks are: absolute /app, /tests, /logs paths."""
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "instruction.md").write_text("Write done into /app/status.txt\n")
    (task / "task.toml").write_text(toml if toml is not None else """
version = "1.0"
[metadata]
difficulty = "easy"
tags = ["demo"]
[verifier]
timeout_sec = 30.0
[agent]
timeout_sec = 90
""")
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (task / "environment" / "seed.txt").write_text("seed\n")
    (task / "tests" / "expected.txt").write_text("done\n")
    (task / "tests" / "test.sh").write_text(test_sh if test_sh is not None else """#!/bin/bash
mkdir -p /logs/verifier
if cmp -s /app/status.txt /tests/expected.txt; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
""")
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\necho done > /app/status.txt\n")
    return task


async def test_harbor_task_loads_and_verifies(tmp_path: Path):
    directory = harbor_task(tmp_path / "tasks")
    (task,) = load_tasks(directory)
    assert task.id == "harbor-demo" and task.instruction.startswith("Write done")
    assert (task.agent_timeout, task.verifier_timeout) == (90.0, 30.0)
    assert task.difficulty == "easy" and task.tags == ("demo",)
    assert task.dockerfile == directory / "environment" / "Dockerfile"
    assert [t.id for t in load_tasks(tmp_path / "tasks")] == ["harbor-demo"]

    async def check_workdir(box: LocalSandbox) -> None:
        assert sorted(p.name for p in box.workdir.iterdir()) == ["seed.txt", "status.txt"]

    solved = await attempt(task, tmp_path / "runs", solve=True, agent=check_workdir)
    assert solved.reward == 1.0 and solved.passed
    failed = await attempt(task, tmp_path / "runs", solve=False)
    assert failed.reward == 0.0 and not failed.passed and failed.status == "scored"


@pytest.mark.parametrize(("written", "reward", "status"), [
    ('{"reward": 0.5, "tests_passed": 2}', 0.5, "scored"),
    ('{"score": 0.25}', 0.25, "scored"),
    ("0.75", 0.75, "scored"),
    ('{"a": 1, "b": 2}', 0.0, "bad_reward"),
    ("not json", 0.0, "bad_reward"),
])
async def test_reward_json(tmp_path: Path, written: str, reward: float, status: str):
    test_sh = f"mkdir -p /logs/verifier\necho '{written}' > /logs/verifier/reward.json\n"
    (task,) = load_tasks(harbor_task(tmp_path, test_sh=test_sh))
    verdict = await attempt(task, tmp_path / "runs", solve=False)
    assert (verdict.reward, verdict.status, verdict.passed) == (reward, status, False)
    if status == "scored" and written.startswith("{"):
        assert verdict.raw == json.loads(written)


async def test_missing_reward_file_gives_zero_with_a_reason(tmp_path: Path):
    (task,) = load_tasks(harbor_task(tmp_path, test_sh="echo all good; exit 0\n"))
    verdict = await attempt(task, tmp_path / "runs", solve=True)
    assert verdict.reward == 0.0 and not verdict.passed and verdict.status == "no_reward"
    assert "reward.txt" in verdict.reason and "exit code 0" in verdict.reason
    assert "all good" in verdict.output


async def test_bad_reward_txt_and_verifier_timeout(tmp_path: Path):
    (task,) = load_tasks(harbor_task(tmp_path, "bad", test_sh=(
        "mkdir -p /logs/verifier; echo lots > /logs/verifier/reward.txt\n")))
    verdict = await attempt(task, tmp_path / "runs", solve=False)
    assert verdict.status == "bad_reward" and "lots" in verdict.reason
    (slow,) = load_tasks(harbor_task(tmp_path, "slow", test_sh="sleep 30\n", toml=(
        "[verifier]\ntimeout_sec = 1\n")))
    verdict = await attempt(slow, tmp_path / "runs", solve=False)
    assert verdict.status == "timed_out" and verdict.reward == 0.0 and verdict.seconds < 10


@pytest.mark.parametrize(("broken", "message"), [
    (lambda t: (t / "instruction.md").unlink(), "instruction.md"),
    (lambda t: (t / "tests" / "test.sh").unlink(), "test.sh"),
    (lambda t: (t / "task.toml").write_text("[agent\n"), "malformed .*task.toml"),
    (lambda t: (t / "task.toml").write_text("[agent]\ntimeout_sec = -1\n"), "timeout_sec"),
])
def test_broken_harbor_task_names_task_and_file(tmp_path: Path, broken, message: str):
    directory = harbor_task(tmp_path, "broken")
    broken(directory)
    with pytest.raises(TaskError, match=message) as info:
        load_tasks(directory)
    assert "'broken'" in str(info.value)


# -- inline JSONL ----------------------------------------------------------------------------

INLINE = [
    {"id": "add", "instruction": "Make add() in calc.py add.",
     "files": {"calc.py": "def add(a, b):\n    return a - b\n"},
     "test_file": {"path": "test_calc.py",
                   "content": "from calc import add\n\n\ndef test_add():\n"
                              "    assert add(2, 3) == 5\n"},
     "solution": ["sed -i 's/a - b/a + b/' calc.py"], "timeout": 60, "difficulty": "easy"},
    {"id": "count", "instruction": "Write the number of lines of data.txt to n.txt.",
     "setup": ["printf 'a\\nb\\nc\\n' > data.txt"],
     "verify": ['test "$(cat n.txt)" = 3'], "solution": ["wc -l < data.txt > n.txt"],
     "tags": ["shell"]},
]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


async def test_jsonl_tasks_load_and_verify(tmp_path: Path):
    tasks = load_tasks(write_jsonl(tmp_path / "tasks.jsonl", INLINE))
    assert [t.id for t in tasks] == ["add", "count"]
    add, count = tasks
    assert add.agent_timeout == 60 and add.difficulty == "easy" and add.files
    assert count.setup and count.verify_commands and count.tags == ("shell",)
    for task in tasks:
        assert (await attempt(task, tmp_path / "runs", solve=True)).reward == 1.0
        assert (await attempt(task, tmp_path / "runs", solve=False)).reward == 0.0


async def test_jsonl_setup_failure_is_a_task_error(tmp_path: Path):
    row = {"id": "bad-setup", "instruction": "x", "setup": ["exit 7"], "verify": ["true"]}
    (task,) = load_tasks(write_jsonl(tmp_path / "t.jsonl", [row]))
    with pytest.raises(TaskError, match=r"bad-setup.*exited 7"):
        await attempt(task, tmp_path / "runs", solve=False)


@pytest.mark.parametrize(("row", "message"), [
    ("{not json", "line 2: not valid JSON"),
    ({"id": "x", "instruction": "y"}, "'verify' commands or a 'test_file'"),
    ({"id": "x", "instruction": "y", "verify": ["true"], "colour": 1}, "colour"),
    ({"id": "x", "instruction": "y", "verify": ["true"], "files": {"/etc/x": ""}}, "relative"),
    ({"id": "x", "instruction": "y", "verify": ["true"], "files": {"../x": ""}}, "relative"),
    ({"id": "x", "instruction": "y", "verify": ["true"], "timeout": 0}, "positive"),
    ({"instruction": "y", "verify": ["true"]}, "id"),
    (INLINE[1], "'count' appears more than once"),
])
def test_bad_jsonl_names_the_line(tmp_path: Path, row, message: str):
    path = write_jsonl(tmp_path / "bad.jsonl", [INLINE[1], row])
    with pytest.raises(TaskError, match=message):
        load_tasks(path)


def test_unknown_source(tmp_path: Path):
    with pytest.raises(TaskError, match="not a task directory"):
        load_tasks(tmp_path / "nothing-here")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskError, match="no tasks"):
        load_tasks(tmp_path / "empty")
