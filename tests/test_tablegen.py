"""The generated data-analysis tasks (rollout/tasks/tablegen.py): deterministic per seed, train
and held-out sets that share no table, every reference solution passing and an empty
attempt failing (all of them in one Python process, a sample in the local sandbox; a
sample in Docker is in tests/test_docker_tasks.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.cli import main
from harnessrl.rollout.tasks.tablegen import TIERS, generate_sets, task_files
from harnessrl.rollout.tasks.task import load_tasks
from harnessrl.rollout.tasks.taskset import check_tasks


def test_generation_is_deterministic_per_seed() -> None:
    a, b = generate_sets(7, 60, 30), generate_sets(7, 60, 30)
    assert a == b
    other = generate_sets(8, 60, 30)
    assert {t.id for t in a.train}.isdisjoint({t.id for t in other.train})
    # The held-out set is drawn first: it does not move with the train set's size.
    assert generate_sets(7, 5, 30).held_out == a.held_out


def test_train_and_held_out_share_no_table_and_every_tier_is_there() -> None:
    sets = generate_sets(0, 1000, 250)
    tables = [{text for text in t.files.values()} for t in sets.train]
    held = set().union(*(t.files.values() for t in sets.held_out))
    assert all(t.isdisjoint(held) for t in tables)
    everything = [text for t in (*sets.train, *sets.held_out) for text in t.files.values()]
    assert len(everything) == len(set(everything))  # no table twice, within a set either
    assert len({t.id for t in (*sets.train, *sets.held_out)}) == 1250
    for tasks in (sets.train, sets.held_out):
        counts = {tier: sum(t.tier == tier for t in tasks) for tier in TIERS}
        assert max(counts.values()) - min(counts.values()) <= 1, counts


def test_unknown_tiers_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown tiers"):
        generate_sets(0, 1, 1, ("count", "median"))


# Every task of a full set, in one process: the solution's answer file must pass the
# task's own check.py and an empty workdir must fail it (the /app path pointed at a
# scratch directory). Runs the generated programs exactly as written.
_ALL = r"""
import json, os, pathlib, sys, tempfile
failures = []
for task in json.load(sys.stdin):
    with tempfile.TemporaryDirectory() as d:
        work = pathlib.Path(d)
        for rel, text in task["files"].items():
            if rel.startswith("environment/"):
                (work / rel.split("/", 1)[1]).write_text(text)
        check = task["files"]["tests/check.py"].replace("/app/", f"{d}/")
        def verdict():
            try:
                exec(compile(check, "check.py", "exec"), {"__name__": "__main__"})
            except SystemExit as stop:
                return stop.code == 0
        empty = verdict()
        os.chdir(work)
        exec(task["files"]["solution/solve.py"], {})
        solved = verdict()
        os.chdir("/")
        if empty or not solved:
            failures.append((task["id"], empty, solved))
print(json.dumps(failures))
"""


def test_every_reference_solution_passes_and_every_empty_attempt_fails() -> None:
    sets = generate_sets(0, 1000, 250)
    payload = [{"id": t.id, "files": task_files(t)} for t in (*sets.train, *sets.held_out)]
    done = subprocess.run([sys.executable, "-c", _ALL], input=json.dumps(payload),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_a_wrong_answer_fails_and_a_number_may_be_written_as_a_float(tmp_path: Path) -> None:
    [task] = generate_sets(3, 0, 1, ("sum",)).held_out
    check = task_files(task)["tests/check.py"].replace("/app/", f"{tmp_path}/")
    for written, passes in ((f"{task.answer}\n", True), (f" {task.answer}.0 ", True),
                            (f"{int(task.answer) + 1}\n", False), ("the answer\n", False)):
        (tmp_path / "answer.txt").write_text(written)
        done = subprocess.run([sys.executable, "-c", check], capture_output=True)
        assert (done.returncode == 0) is passes, written


def test_written_sets_load_and_a_sample_passes_the_check_locally(tmp_path: Path,
                                                                capsys) -> None:
    out = tmp_path / "set"
    assert main(["tasks", "generate", str(out), "--seed", "1", "--train", "12",
                 "--held-out", "6"]) == 0
    train, held = load_tasks(out / "train"), load_tasks(out / "held_out")
    assert (len(train), len(held)) == (12, 6)
    assert {t.difficulty for t in held} == set(TIERS)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seed"] == 1 and manifest["counts"] == {"train": 12, "held_out": 6}
    rows = asyncio.run(check_tasks(held))
    assert [(r.task, r.problems) for r in rows if not r.ok] == []
    # A second generation into the same directory is refused, not mixed in.
    assert main(["tasks", "generate", str(out), "--train", "1", "--held-out", "1"]) == 2
    assert "already" in capsys.readouterr().err
