"""Task sets as their authors handle them: check, list and split (`harnessrl tasks ...`).

`check` runs, for every task, two attempts in fresh sandboxes of the chosen kind, with no
agent and no model: the reference solution must pass, and an empty attempt (the workdir as
the task gives it) must be scored and fail. A task that cannot be checked (its image does not
build, it has no reference solution, its verifier writes no reward) fails the check and its
row says why. What verifiers offers as `--only-gold` / `--only-noop`, in one pass.

`split` draws a seeded held-out share of a set and writes the two parts as task sets of the
same format (task directories copied, or JSONL lines kept as written), each loadable with
`load_tasks`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from harnessrl.harnesses.base import DEFAULT_TOOLS_DIR
from harnessrl.rollout.sandbox import registry
from harnessrl.rollout.sandbox.base import BackendOptions, BuildNetwork, Sandbox, SandboxError
from harnessrl.rollout.tasks.task import Task, TaskError, Verdict, prepare, run_solution, verify

Attempt = Literal["solution", "empty"]


@dataclass(frozen=True)
class Sandboxes:
    """Where a check's attempts get their sandboxes: one per attempt, from `backend`, at
    `root/<a name unique in the check>`."""

    backend: registry.SandboxBackend
    root: Path

    async def make(self, task: Task, name: str) -> Sandbox:
        return await self.backend.sandbox(self.root, name, task)


@dataclass(frozen=True)
class CheckRow:
    task: str
    solution: str  # "passes", "fails", "error" or "none" (no reference solution)
    empty: str  # "fails" (as it should), "passes", "no score" or "error"
    problems: tuple[str, ...]  # why the task failed its check; empty when it passed
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.problems


def _reason(verdict: Verdict) -> str:
    tail = " ".join(verdict.output.split()[-30:])
    why = verdict.reason or f"reward {verdict.reward:g}"
    return f"{verdict.status}: {why}" + (f"; verifier output: {tail}" if tail else "")


async def _attempt(task: Task, boxes: Sandboxes, name: str, attempt: Attempt) -> Verdict:
    sandbox = await boxes.make(task, name)
    try:
        await prepare(task, sandbox)
        if attempt == "solution":
            await run_solution(task, sandbox)
        return await verify(task, sandbox)
    finally:
        await sandbox.close()


async def check_task(task: Task, boxes: Sandboxes, name: str) -> CheckRow:
    """Both attempts of one task (one after the other: each may build or start an image)."""
    started = time.monotonic()
    problems: list[str] = []
    if task.solution_dir is None and not task.solution_commands:
        solution = "none"
        problems.append("no reference solution (solution/solve.sh or 'solution')")
    else:
        try:
            solved = await _attempt(task, boxes, f"{name}-solution", "solution")
            solution = "passes" if solved.passed else "fails"
            if not solved.passed:
                problems.append(f"the reference solution does not pass ({_reason(solved)})")
        except (SandboxError, TaskError, OSError) as error:
            solution = "error"
            problems.append(f"reference solution: {error}")
    try:
        empty_verdict = await _attempt(task, boxes, f"{name}-empty", "empty")
        if empty_verdict.status != "scored":
            empty = "no score"
            problems.append("an empty attempt is not scored (a runner would count every "
                            f"unsolved rollout as an infrastructure error): "
                            f"{_reason(empty_verdict)}")
        elif empty_verdict.reward > 0:
            empty = "passes"
            problems.append(f"an empty attempt gets reward {empty_verdict.reward:g}: the "
                            "verifier does not test the work")
        else:
            empty = "fails"
    except (SandboxError, TaskError, OSError) as error:
        empty = "error"
        problems.append(f"empty attempt: {error}")
    return CheckRow(task.id, solution, empty, tuple(problems), time.monotonic() - started)


async def check_tasks(tasks: Sequence[Task], *, sandbox: str = "local",
                      concurrency: int = 2, image: str | None = None,
                      build_network: BuildNetwork = "none", tools: Path | None = None,
                      root: Path | None = None) -> list[CheckRow]:
    """Every task's check, `concurrency` tasks at a time, in task order, in sandboxes of
    the backend called `sandbox` (registry.py)."""
    with tempfile.TemporaryDirectory(prefix="hrl-check-") as scratch:
        base = Path(root or scratch)
        backend = registry.backend(sandbox, BackendOptions(
            tools=Path(tools or DEFAULT_TOOLS_DIR), image=image, build_network=build_network,
            run_label=str(base)))
        boxes = Sandboxes(backend, base)
        gate = asyncio.Semaphore(max(1, concurrency))

        async def one(number: int, task: Task) -> CheckRow:
            async with gate:
                row = await check_task(task, boxes, f"t{number}")
            if sandbox == "local" and task.own_image and not row.ok:
                hint = ("the local sandbox runs no Dockerfile and no docker_image; this task "
                        "may need its image: --sandbox docker")
                row = dataclasses.replace(row, problems=(*row.problems, hint))
            return row

        try:
            return list(await asyncio.gather(*(one(n, t) for n, t in enumerate(tasks))))
        finally:
            await backend.drain()


def check_exit_code(rows: Sequence[CheckRow]) -> int:
    """0 when every task passed its check, 1 otherwise (for CI)."""
    return 0 if rows and all(row.ok for row in rows) else 1


# -- list ------------------------------------------------------------------------------------

def environment_of(task: Task) -> str:
    """How a container backend gets the task's image, in a word or two."""
    if task.docker_image is not None:
        return f"image {task.docker_image}" + (" (archive)" if task.image_archive else "")
    if task.dockerfile is not None:
        return "Dockerfile"
    return "base image" if task.tests_dir is not None else "inline"


def describe(tasks: Sequence[Task]) -> list[dict[str, object]]:
    """One row per task for `tasks list` (and its --json)."""
    return [{"id": t.id, "difficulty": t.difficulty, "tags": list(t.tags),
             "environment": environment_of(t),
             "solution": t.solution_dir is not None or bool(t.solution_commands),
             "agent_timeout": t.agent_timeout, "source": str(t.source) if t.source else None}
            for t in tasks]


# -- split -----------------------------------------------------------------------------------

def split_tasks(tasks: Sequence[Task], *, held_out: float, seed: int
                ) -> tuple[list[Task], list[Task]]:
    """(train, held_out): a seeded draw of round(held_out * n) tasks (at least one, and at
    least one left to train on). The same ids and seed give the same split whatever order
    the tasks were listed in."""
    if not 0 < held_out < 1:
        raise TaskError(f"the held-out share must be between 0 and 1, not {held_out!r}")
    if len(tasks) < 2:
        raise TaskError(f"a split needs at least 2 tasks, not {len(tasks)}")
    ordered = sorted(tasks, key=lambda t: t.id)
    random.Random(seed).shuffle(ordered)
    count = min(len(ordered) - 1, max(1, round(held_out * len(ordered))))
    chosen = {t.id for t in ordered[:count]}
    return ([t for t in tasks if t.id not in chosen], [t for t in tasks if t.id in chosen])


def write_task_set(tasks: Sequence[Task], dest: Path) -> Path:
    """Write `tasks` as a task set at `dest`: a directory of task directories (Harbor
    layout, copied) or, for inline tasks, `dest` with a .jsonl suffix holding their lines
    as written. Refuses to write over anything. Returns what it wrote."""
    if all(t.tests_dir is not None and t.source is not None and t.source.is_dir()
           for t in tasks):
        if dest.exists():
            raise TaskError(f"{dest} already exists; choose a new place for the task set")
        dest.mkdir(parents=True)
        for task in tasks:
            assert task.source is not None
            shutil.copytree(task.source, dest / task.source.name, symlinks=True)
        return dest
    if any(t.source is None or t.source.suffix != ".jsonl" for t in tasks):
        raise TaskError("a split writes Harbor task directories or JSONL tasks, not a mix")
    target = dest.with_suffix(".jsonl")
    if target.exists():
        raise TaskError(f"{target} already exists; choose a new place for the task set")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("".join(line + "\n" for line in _jsonl_lines(tasks)))
    return target


def _jsonl_lines(tasks: Sequence[Task]) -> list[str]:
    """Each inline task's own line, as written in its file."""
    lines: dict[tuple[Path, str], str] = {}
    for source in {t.source for t in tasks if t.source is not None}:
        for line in source.read_text(encoding="utf-8").splitlines():
            if line.strip():
                lines[(source, json.loads(line).get("id"))] = line
    return [lines[(t.source, t.id)] for t in tasks if t.source is not None]


def split_task_set(tasks: Sequence[Task], out: Path, *, held_out: float, seed: int
                   ) -> tuple[Path, Path]:
    """`split_tasks`, written as out/train and out/held_out (directories or .jsonl)."""
    train, test = split_tasks(tasks, held_out=held_out, seed=seed)
    for name in ("train", "held_out"):
        for existing in (out / name, out / f"{name}.jsonl"):
            if existing.exists():
                raise TaskError(f"{existing} already exists; choose a new --out")
    return write_task_set(train, out / "train"), write_task_set(test, out / "held_out")
