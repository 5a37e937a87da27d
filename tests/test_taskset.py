"""`harnessrl tasks check|list|split` in the local sandbox (the docker side is in
tests/test_docker_tasks.py), and the [environment] table's image fields."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from harnessrl.cli import main
from harnessrl.rollout.tasks.task import TaskError, load_harbor_task, load_tasks
from harnessrl.rollout.tasks.taskset import check_tasks, describe, split_tasks

EXAMPLES = Path(__file__).parent.parent / "examples" / "harbor_tasks"


def _task(root: Path, name: str, *, test: str, solve: str | None = "touch done",
          toml: str = "") -> Path:
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "instruction.md").write_text(f"Do {name}\n")
    (d / "task.toml").write_text(toml)
    (d / "tests" / "test.sh").write_text(test)
    if solve is not None:
        (d / "solution").mkdir()
        (d / "solution" / "solve.sh").write_text(solve + "\n")
    return d


GOOD = 'if [ -f "$WORKDIR/done" ]; then echo 1; else echo 0; fi > "$LOGS_DIR/reward.txt"\n'


def test_check_passes_a_good_set_and_says_why_each_bad_task_fails(tmp_path: Path,
                                                                  capsys) -> None:
    _task(tmp_path, "good", test=GOOD)
    _task(tmp_path, "lenient", test='echo 1 > "$LOGS_DIR/reward.txt"\n')
    _task(tmp_path, "wrong-solution", test=GOOD, solve="touch nearly-done")
    _task(tmp_path, "no-solution", test=GOOD, solve=None)
    _task(tmp_path, "silent", test='[ -f "$WORKDIR/done" ] && echo 1 > "$LOGS_DIR/reward.txt"\n')
    _task(tmp_path, "crashing-solution", test=GOOD, solve="exit 3")
    rows = {r.task: r for r in asyncio.run(check_tasks(load_tasks(tmp_path)))}
    assert rows["good"].ok and (rows["good"].solution, rows["good"].empty) == ("passes",
                                                                              "fails")
    assert (rows["lenient"].solution, rows["lenient"].empty) == ("passes", "passes")
    assert "does not test the work" in rows["lenient"].problems[0]
    assert rows["wrong-solution"].solution == "fails"
    assert "does not pass (scored: reward 0" in rows["wrong-solution"].problems[0]
    assert rows["no-solution"].solution == "none"
    assert rows["silent"].empty == "no score" and "no_reward" in rows["silent"].problems[0]
    assert rows["crashing-solution"].solution == "error"
    assert "reference solution failed" in rows["crashing-solution"].problems[0]
    assert [name for name, row in rows.items() if row.ok] == ["good"]

    assert main(["tasks", "check", str(tmp_path / "good")]) == 0
    assert main(["tasks", "check", str(tmp_path), "--json"]) == 1
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()
             if line.startswith("{")]
    assert {line["task"]: line["ok"] for line in lines}["good"] is True
    assert sum(not line["ok"] for line in lines) == 5
    assert main(["tasks", "check", str(tmp_path / "nowhere")]) == 2


@pytest.mark.slow
def test_check_passes_the_bundled_easy_tasks_locally() -> None:
    rows = asyncio.run(check_tasks(load_tasks("bundled:easy")))
    assert len(rows) == 10 and [r.problems for r in rows if not r.ok] == []


def test_an_image_task_checked_locally_is_told_it_may_need_docker() -> None:
    [row] = asyncio.run(check_tasks(load_tasks(EXAMPLES / "fix-mean")))
    assert not row.ok and "--sandbox docker" in row.problems[-1]


def test_list_shows_the_set(capsys) -> None:
    rows = describe(load_tasks(EXAMPLES))
    assert len(rows) >= 8 and {r["environment"] for r in rows} == {"Dockerfile"}
    assert all(r["solution"] for r in rows)
    assert main(["tasks", "list", "bundled:easy", "--json"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(listed) == 10 and listed[0]["environment"] == "Dockerfile"


def test_split_is_seeded_disjoint_and_written_as_two_loadable_sets(tmp_path: Path) -> None:
    tasks = load_tasks("bundled")
    train, held = split_tasks(tasks, held_out=0.25, seed=7)
    again = split_tasks(list(reversed(tasks)), held_out=0.25, seed=7)
    assert {t.id for t in again[1]} == {t.id for t in held}  # order of listing is no matter
    other = split_tasks(tasks, held_out=0.25, seed=8)[1]
    assert {t.id for t in other} != {t.id for t in held}
    assert len(held) == 8 and not {t.id for t in train} & {t.id for t in held}
    assert main(["tasks", "split", "bundled", "--out", str(tmp_path / "s"),
                 "--held-out", "0.25", "--seed", "7"]) == 0
    assert sorted(t.id for t in load_tasks(tmp_path / "s" / "held_out")) == sorted(
        t.id for t in held)
    assert len(load_tasks(tmp_path / "s" / "train")) == 24
    assert main(["tasks", "split", "bundled", "--out", str(tmp_path / "s")]) == 2  # exists


def test_split_of_inline_tasks_keeps_their_lines(tmp_path: Path) -> None:
    lines = [json.dumps({"id": f"t{i}", "instruction": f"do {i}", "verify": ["true"]})
             for i in range(5)]
    source = tmp_path / "set.jsonl"
    source.write_text("\n".join(lines) + "\n")
    assert main(["tasks", "split", str(source), "--out", str(tmp_path / "out"),
                 "--held-out", "0.4", "--seed", "1"]) == 0
    held = (tmp_path / "out" / "held_out.jsonl").read_text().splitlines()
    train = (tmp_path / "out" / "train.jsonl").read_text().splitlines()
    assert len(held) == 2 and sorted(held + train) == sorted(lines)
    with pytest.raises(TaskError, match="between 0 and 1"):
        split_tasks(load_tasks(source), held_out=1.0, seed=0)


def test_environment_image_fields(tmp_path: Path) -> None:
    d = _task(tmp_path, "prebuilt", test=GOOD, toml='[environment]\ndocker_image = "a/b:1"\n'
                                                   'docker_image_archive = "image.tar"\n')
    with pytest.raises(TaskError, match=r"'image\.tar' is not a file"):
        load_harbor_task(d)
    (d / "image.tar").write_bytes(b"")
    task = load_harbor_task(d)
    assert (task.docker_image, task.image_archive, task.own_image) == (
        "a/b:1", d / "image.tar", True)
    (d / "task.toml").write_text('[environment]\ndocker_image_archive = "image.tar"\n')
    with pytest.raises(TaskError, match="needs docker_image"):
        load_harbor_task(d)
    (d / "task.toml").write_text('[environment]\ndocker_image = "two words"\n')
    with pytest.raises(TaskError, match="must be an image name"):
        load_harbor_task(d)
