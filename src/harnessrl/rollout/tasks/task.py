"""Tasks: what an agent is asked to do, how its workdir starts, and how the result is scored.

Two formats load into one `Task`:

- the Harbor layout, one directory per task::

      instruction.md          the prompt
      task.toml               [agent] timeout_sec, [verifier] timeout_sec, [metadata],
                              [environment] docker_image, docker_image_archive, cpus, memory_mb
      environment/            the image's build context (environment/Dockerfile), or without
                              an image of its own, copied into the workdir
      tests/test.sh           the verifier; writes reward.txt or reward.json
      solution/solve.sh       the reference solution (optional)

- inline JSONL, one task per line::

      {"id", "instruction", "files": {path: content}, "setup": [cmd], "verify": [cmd]
       | "test_file": {"path", "content"}, "timeout", "verifier_timeout", "solution": [cmd]}

Where things live. Harbor's container has the agent in the image's WORKDIR (/app in most
tasks) with the image's files there as built, the tests uploaded to /tests only after the
agent finishes, the verifier writing /logs/verifier/reward.{txt,json}, and the reference
solution in /solution. A container of the task's own image (the docker sandbox, a task with
environment/Dockerfile or docker_image) is exactly that: its `task_root` is "/" and its
`workdir` the image's WORKDIR. Any other sandbox mirrors it with its workdir's parent as "/"
and environment/ copied into the workdir:

    <base>/work  (= /app, the workdir)    <base>/tests      (= /tests)
    <base>/logs/verifier (= /logs/verifier) <base>/solution (= /solution)

Scripts get the real locations as WORKDIR, TESTS_DIR, LOGS_DIR and SOLUTION_DIR (and PYTHON,
the interpreter that has pytest). Scripts written for Harbor that hard-code the absolute
paths are rewritten on the way in (text files under tests/ and solution/ only) when <base>
is not "/": a best effort for foreign tasks; the bundled ones use the variables.

`verify` copies the tests in only after the agent has finished, into a freshly emptied
tests/ and logs/ (so nothing the agent planted there counts), and never invents a score
either way: no reward file is `no_reward` with the reason, and a verifier that cannot run
(its interpreter, pytest or program missing: checked first, and exit 126/127) is
`not_run`. Both are infrastructure errors for the runner, never a 0.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import sys
import tempfile
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from harnessrl.rollout.sandbox.base import Sandbox
from harnessrl.rollout.tasks.reward_files import CANNOT_RUN as CANNOT_RUN
from harnessrl.rollout.tasks.reward_files import VerdictStatus, read_reward

BUNDLED = Path(__file__).parent.parent / "bundled_tasks"  # rollout/bundled_tasks
DIFFICULTIES = ("easy", "medium", "hard")


class TaskError(ValueError):
    """A task that cannot be loaded or prepared; the message names the task and the file."""


@dataclass(frozen=True)
class Task:
    id: str
    instruction: str
    agent_timeout: float = 600.0
    verifier_timeout: float = 120.0
    setup_timeout: float = 120.0
    files: Mapping[str, bytes] = field(default_factory=dict)  # placed in the workdir
    environment_dir: Path | None = None  # Harbor environment/ (see the module docstring)
    dockerfile: Path | None = None  # built by container backends; local does not run it
    docker_image: str | None = None  # [environment] docker_image: a prebuilt image, by name
    image_archive: Path | None = None  # a `docker save` tarball holding docker_image
    setup: tuple[str, ...] = ()
    tests_dir: Path | None = None  # Harbor tests/ with test.sh
    test_files: Mapping[str, bytes] = field(default_factory=dict)  # inline test_file
    verify_commands: tuple[str, ...] = ()  # inline: all exit 0 -> reward 1
    solution_dir: Path | None = None  # Harbor solution/ with solve.sh
    solution_commands: tuple[str, ...] = ()  # inline reference solution
    source: Path | None = None
    difficulty: str | None = None
    tags: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    environment: Mapping[str, Any] = field(default_factory=dict)  # [environment] as written

    @property
    def own_image(self) -> bool:
        """Whether a container backend runs this task in an image of its own (built from
        its Dockerfile or named by docker_image), whose WORKDIR and files are the agent's."""
        return self.dockerfile is not None or self.docker_image is not None


@dataclass(frozen=True)
class Verdict:
    reward: float
    passed: bool  # full reward
    output: str  # the verifier's stdout and stderr
    seconds: float
    raw: Any = None  # reward.json as written, if any
    status: VerdictStatus = "scored"
    reason: str | None = None  # why the reward is 0 without a score
    exit_code: int | None = None


# -- Harbor layout ---------------------------------------------------------------------------

def _read(task_id: str, path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskError(f"task {task_id!r}: missing {path}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise TaskError(f"task {task_id!r}: cannot read {path}: {error}") from None


def _timeout(task_id: str, path: Path, table: Any, default: float) -> float:
    if not isinstance(table, dict) or table.get("timeout_sec") is None:
        return default
    value = table["timeout_sec"]
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise TaskError(f"task {task_id!r}: {path}: timeout_sec must be a positive number, "
                        f"not {value!r}")
    return float(value)


def load_harbor_task(directory: Path) -> Task:
    directory = Path(directory).resolve()
    task_id = directory.name
    toml_path = directory / "task.toml"
    try:
        config = tomllib.loads(_read(task_id, toml_path))
    except tomllib.TOMLDecodeError as error:
        raise TaskError(f"task {task_id!r}: malformed {toml_path}: {error}") from None
    if not (directory / "tests" / "test.sh").is_file():
        raise TaskError(f"task {task_id!r}: missing {directory / 'tests' / 'test.sh'}")
    metadata = config.get("metadata") or {}
    environment = directory / "environment"
    dockerfile = environment / "Dockerfile"
    tags = metadata.get("tags") or ()
    table = config.get("environment") or {}
    if not isinstance(table, dict):
        raise TaskError(f"task {task_id!r}: {toml_path}: [environment] must be a table")
    image, archive = _image(task_id, toml_path, directory, table)
    return Task(
        id=task_id,
        instruction=_read(task_id, directory / "instruction.md"),
        agent_timeout=_timeout(task_id, toml_path, config.get("agent"), 600.0),
        verifier_timeout=_timeout(task_id, toml_path, config.get("verifier"), 120.0),
        environment_dir=environment if environment.is_dir() else None,
        dockerfile=dockerfile if dockerfile.is_file() else None,
        docker_image=image, image_archive=archive, environment=table,
        tests_dir=directory / "tests",
        solution_dir=directory / "solution" if (directory / "solution").is_dir() else None,
        source=directory,
        difficulty=metadata.get("difficulty"),
        tags=tuple(tags) if isinstance(tags, list) else (str(tags),),
        metadata=metadata,
    )


def _image(task_id: str, path: Path, directory: Path, table: dict[str, Any]
           ) -> tuple[str | None, Path | None]:
    """[environment] docker_image (a name, name:tag, name@sha256:... or an image id) and
    docker_image_archive (a tarball in the task directory that `docker load` reads)."""
    image, archive = table.get("docker_image"), table.get("docker_image_archive")
    if image is not None and (not isinstance(image, str) or not image.strip()
                              or any(c.isspace() for c in image)):
        raise TaskError(f"task {task_id!r}: {path}: docker_image must be an image name, "
                        f"not {image!r}")
    if archive is None:
        return image, None
    if image is None:
        raise TaskError(f"task {task_id!r}: {path}: docker_image_archive needs docker_image "
                        "(the name the tarball holds)")
    if not isinstance(archive, str):
        raise TaskError(f"task {task_id!r}: {path}: docker_image_archive must be a path")
    found = (directory / _relative(f"task {task_id!r}: {path}", archive)).resolve()
    if not found.is_file():
        raise TaskError(f"task {task_id!r}: {path}: docker_image_archive {archive!r} is "
                        f"not a file in {directory}")
    return image, found


# -- inline JSONL ----------------------------------------------------------------------------

class _TestFile(msgspec.Struct, forbid_unknown_fields=True):
    path: str
    content: str


class _InlineTask(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    instruction: str
    files: dict[str, str] = {}
    setup: list[str] = []
    verify: list[str] = []
    test_file: _TestFile | None = None
    timeout: float = 600.0
    verifier_timeout: float = 120.0
    solution: list[str] = []
    difficulty: str | None = None
    tags: list[str] = []


def _relative(where: str, path: str) -> str:
    parts = Path(path).parts
    if not path or Path(path).is_absolute() or ".." in parts:
        raise TaskError(f"{where}: file path {path!r} must be relative, without '..'")
    return path


def _inline_task(where: str, line: str, source: Path) -> Task:
    try:
        raw = msgspec.json.decode(line, type=_InlineTask)
    except msgspec.ValidationError as error:
        raise TaskError(f"{where}: {error}") from None
    except msgspec.DecodeError as error:
        raise TaskError(f"{where}: not valid JSON: {error}") from None
    where = f"{where} (task {raw.id!r})"
    if not raw.verify and raw.test_file is None:
        raise TaskError(f"{where}: give 'verify' commands or a 'test_file'")
    if raw.timeout <= 0 or raw.verifier_timeout <= 0:
        raise TaskError(f"{where}: timeouts must be positive")
    tests = {}
    verify = tuple(raw.verify)
    if raw.test_file is not None:
        tests[_relative(where, raw.test_file.path)] = raw.test_file.content.encode()
        tests["run_tests.py"] = PYTEST_RUNNER.read_bytes()
        verify = verify or (PYTEST_COMMAND,)
    return Task(
        id=raw.id, instruction=raw.instruction, agent_timeout=raw.timeout,
        verifier_timeout=raw.verifier_timeout,
        files={_relative(where, p): c.encode() for p, c in raw.files.items()},
        setup=tuple(raw.setup), test_files=tests, verify_commands=verify,
        solution_commands=tuple(raw.solution), source=source, difficulty=raw.difficulty,
        tags=tuple(raw.tags))


def load_jsonl(path: Path) -> list[Task]:
    tasks = []
    for number, line in enumerate(_read(path.name, path).splitlines(), 1):
        if line.strip():
            tasks.append(_inline_task(f"{path} line {number}", line, path))
    return tasks


# -- finding tasks ---------------------------------------------------------------------------

def _bundled(selector: str) -> list[Task]:
    tasks = load_tasks(BUNDLED)
    if not selector:
        return tasks
    wanted = set(selector.split(","))
    chosen = [t for t in tasks if t.difficulty in wanted or t.id in wanted]
    unknown = wanted - {t.id for t in chosen} - {t.difficulty for t in chosen}
    if unknown:
        raise TaskError(f"bundled tasks: no task or difficulty named {sorted(unknown)}; "
                        f"difficulties are {', '.join(DIFFICULTIES)}")
    return chosen


def load_tasks(path_or_name: str | Path) -> list[Task]:
    """Tasks from a directory of Harbor tasks, one task directory, a .jsonl file, or the
    bundled set: "bundled", "bundled:easy", "bundled:easy,medium", "bundled:<id>,<id>"."""
    spec = str(path_or_name)
    if spec == "bundled" or spec.startswith("bundled:"):
        return _bundled(spec.partition(":")[2])
    path = Path(path_or_name)
    if path.is_file() and path.suffix == ".jsonl":
        return _check_unique(load_jsonl(path), path)
    if not path.is_dir():
        raise TaskError(f"{path}: not a task directory, a directory of tasks, a .jsonl "
                        "file or a bundled set name")
    if (path / "task.toml").exists() or (path / "instruction.md").exists():
        return [load_harbor_task(path)]
    tasks = [load_harbor_task(child) for child in sorted(path.iterdir())
             if child.is_dir() and ((child / "task.toml").exists()
                                    or (child / "instruction.md").exists())]
    if not tasks:
        raise TaskError(f"{path}: no tasks (no subdirectory has a task.toml)")
    return _check_unique(tasks, path)


def _check_unique(tasks: list[Task], where: Path) -> list[Task]:
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise TaskError(f"{where}: task id {task.id!r} appears more than once")
        seen.add(task.id)
    return tasks


# -- running a task in a sandbox -------------------------------------------------------------

# Inline test files run like the bundled tasks' tests: through pytest_runner.py (copied next
# to them as run_tests.py), with -P so the work dir is not first on sys.path.
PYTEST_RUNNER = Path(__file__).with_name("pytest_runner.py")
PYTEST_COMMAND = 'PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "$PYTHON" -P "$TESTS_DIR/run_tests.py"'
_HARBOR_PATH = re.compile(r"(?<![\w./-])/(app|tests|logs|solution)(?=[/\s\"'`;:)|&]|$)")



@dataclass(frozen=True)
class Layout:
    base: Path  # Harbor's "/": tests/, logs/verifier and solution/ are under it
    workdir: Path  # the agent's (Harbor's /app)

    @classmethod
    def of(cls, sandbox: Sandbox) -> Layout:
        return cls(Path(sandbox.task_root), Path(sandbox.workdir))

    def env(self) -> dict[str, str]:
        """What task scripts are told about where things are (see the module docstring)."""
        return {"WORKDIR": str(self.workdir), "TESTS_DIR": str(self.base / "tests"),
                "LOGS_DIR": str(self.base / "logs" / "verifier"),
                "SOLUTION_DIR": str(self.base / "solution"), "PYTHON": sys.executable,
                "PYTHONDONTWRITEBYTECODE": "1"}

    def relocate(self, text: str) -> str:
        if self.base == Path("/"):
            return text
        return _HARBOR_PATH.sub(lambda m: str(self.workdir if m[1] == "app"
                                              else self.base / m[1]), text)

    def relocate_bytes(self, data: bytes) -> bytes:
        try:
            return self.relocate(data.decode("utf-8")).encode("utf-8")
        except UnicodeDecodeError:
            return data  # binary: copied as is


def _stage(into: Path, directory: Path | None, files: Mapping[str, bytes],
           layout: Layout | None = None, skip: frozenset[str] = frozenset()) -> None:
    """Copy `directory` and `files` into the host dir `into`, relocating Harbor paths in
    text files when a layout is given."""
    sources = [(p.relative_to(directory).as_posix(), p.read_bytes())
               for p in sorted(directory.rglob("*")) if p.is_file()] if directory else []
    for rel, data in [*sources, *files.items()]:
        if rel in skip:
            continue
        if layout is not None:
            data = layout.relocate_bytes(data)
        target = into / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        if directory is not None and (directory / rel).exists():
            target.chmod((directory / rel).stat().st_mode & 0o777)


async def _place(sandbox: Sandbox, dest: str, directory: Path | None,
                 files: Mapping[str, bytes], layout: Layout | None = None,
                 skip: frozenset[str] = frozenset()) -> None:
    with tempfile.TemporaryDirectory(prefix="hrl-stage-") as staging:
        await asyncio.to_thread(_stage, Path(staging), directory, files, layout, skip)
        await sandbox.copy_in(Path(staging), dest)


async def prepare(task: Task, sandbox: Sandbox) -> None:
    """Place the task's files in the workdir and run its setup commands. In a container of
    the task's own image the workdir's files are the image's, as built: nothing is copied."""
    if not sandbox.image_workdir:
        await _place(sandbox, str(sandbox.workdir), task.environment_dir, task.files,
                     skip=frozenset({"Dockerfile", ".dockerignore"}))
    env = Layout.of(sandbox).env()
    for command in task.setup:
        result = await sandbox.run(command, env=env, timeout=task.setup_timeout)
        if result.exit_code != 0:
            raise TaskError(
                f"task {task.id!r}: setup command {command!r} "
                f"{'timed out' if result.timed_out else f'exited {result.exit_code}'}: "
                f"{_text(result.stdout, result.stderr)[-2000:]}")


async def run_solution(task: Task, sandbox: Sandbox) -> None:
    """Apply the task's reference solution in the workdir (the oracle)."""
    layout = Layout.of(sandbox)
    if task.solution_dir is not None:
        await _fresh(sandbox, layout, "solution")
        await _place(sandbox, str(layout.base / "solution"), task.solution_dir, {}, layout)
        commands: tuple[str, ...] = ('bash "$SOLUTION_DIR/solve.sh"',)
    else:
        commands = task.solution_commands
    if not commands:
        raise TaskError(f"task {task.id!r} has no reference solution")
    for command in commands:
        result = await sandbox.run(command, env=layout.env(), timeout=task.agent_timeout)
        if result.exit_code != 0:
            raise TaskError(f"task {task.id!r}: reference solution failed: "
                            f"{_text(result.stdout, result.stderr)[-2000:]}")


async def _fresh(sandbox: Sandbox, layout: Layout, *names: str) -> None:
    paths = " ".join(f"'{layout.base / name}'" for name in names)
    result = await sandbox.run(f"rm -rf {paths} && mkdir -p {paths}", timeout=60)
    if result.exit_code != 0:
        raise TaskError(f"cannot reset {paths}: {_text(result.stdout, result.stderr)}")


async def verify(task: Task, sandbox: Sandbox) -> Verdict:
    """Copy the tests in (only now), run them with the verifier timeout, read the reward."""
    started = time.monotonic()
    layout = Layout.of(sandbox)
    commands = task.verify_commands or ('bash "$TESTS_DIR/test.sh"',)
    if (problem := await _fresh_and_check(task, sandbox, layout, commands)) is not None:
        return Verdict(0.0, False, problem, time.monotonic() - started, status="not_run",
                       reason=problem)
    await _place(sandbox, str(layout.base / "tests"), task.tests_dir, task.test_files, layout)
    deadline = time.monotonic() + task.verifier_timeout
    outputs, result = [], None
    for command in commands:
        result = await sandbox.run(command, env=layout.env(),
                                   timeout=max(0.1, deadline - time.monotonic()))
        outputs.append(_text(result.stdout, result.stderr))
        if result.exit_code != 0:
            break
    assert result is not None
    output = "\n".join(outputs)
    if result.timed_out:
        return Verdict(0.0, False, output, time.monotonic() - started, status="timed_out",
                       reason=f"the verifier timed out after {task.verifier_timeout:g} s")
    with tempfile.TemporaryDirectory(prefix="hrl-logs-") as logs:
        await sandbox.copy_out(str(layout.base / "logs" / "verifier"), Path(logs))
        reward, raw, status, reason = read_reward(Path(logs), result.exit_code,
                                                     by_exit_code=bool(task.verify_commands))
    return Verdict(reward, reward >= 1.0, output, time.monotonic() - started, raw=raw,
                   status=status, reason=reason, exit_code=result.exit_code)


async def _fresh_and_check(task: Task, sandbox: Sandbox, layout: Layout,
                           commands: tuple[str, ...]) -> str | None:
    """Empty tests/ and logs/verifier, then say why the verifier cannot run in this sandbox
    (a program it starts is missing, or $PYTHON has no pytest for our test runner), or None.
    One command, not two: in a container each is a `docker exec`. Checked before it runs:
    a verifier that swallows its own failure would otherwise write a 0. pytest is looked up,
    not imported (an import costs ~0.4 s per rollout); one that is found but cannot import
    still makes run_tests.py exit 127, "could not run"."""
    programs = sorted({p for command in commands if (p := _program(command))})
    checks = [f'command -v {shlex.quote(p)} >/dev/null || echo "{p} is not installed in '
              f'the sandbox"' for p in programs]
    uses_runner = "run_tests.py" in task.test_files or (
        task.tests_dir is not None and (task.tests_dir / "run_tests.py").is_file())
    if uses_runner:
        checks.append('"$PYTHON" -P -c "import importlib.util as u, sys; sys.exit(u.find_spec('
                      '\'pytest\') is None)" 2>/dev/null || echo "the verifier\'s '
                      'interpreter $PYTHON cannot import pytest here"')
    paths = " ".join(shlex.quote(str(layout.base / name)) for name in ("tests", "logs/verifier"))
    script = f"rm -rf {paths} && mkdir -p {paths} || exit 90; " + ("; ".join(checks) or "true")
    result = await sandbox.run(script, env=layout.env(), timeout=60)
    if result.exit_code == 90:
        raise TaskError(f"cannot reset {paths}: {_text(result.stdout, result.stderr)}")
    problem = _text(result.stdout, result.stderr).strip()
    if result.exit_code != 0 and not problem:
        problem = f"the verifier's pre-check exited {result.exit_code}"
    return problem or None


def _program(command: str) -> str | None:
    """The program a shell command starts, when it is named bare (found on PATH)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    first = next((w for w in words if not re.fullmatch(r"[A-Za-z_]\w*=.*", w)), None)
    if first is None or "/" in first or "$" in first:
        return None
    return first


def _text(stdout: bytes, stderr: bytes) -> str:
    return (stdout + stderr).decode("utf-8", errors="replace")
