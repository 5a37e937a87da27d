"""Harbor tasks as Harbor runs them, against a real daemon on the offline base image: the
image's WORKDIR is the agent's, a task's docker_image is used (or loaded) and never built,
builds get a network only when allowed, and `tasks check` passes the repo's Harbor set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from harnessrl.cli import main
from harnessrl.rollout.run import execute, oracle_engine
from harnessrl.rollout.runner import RolloutSettings, RunSettings
from harnessrl.rollout.sandbox.base import SandboxError
from harnessrl.rollout.sandbox.docker import BASE_IMAGE, DockerBackend, DockerSandbox, Images
from harnessrl.rollout.tasks.task import load_harbor_task, load_tasks, prepare, run_solution, verify
from harnessrl.rollout.tasks.taskset import check_tasks
from tests.test_docker import PROBLEM, TOOLS

EXAMPLES = Path(__file__).parent.parent / "examples" / "harbor_tasks"
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"docker sandbox: {PROBLEM}")
QUIET = Console(file=open(os.devnull, "w"))  # noqa: SIM115


def _docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True)


def _task(root: Path, name: str, *, dockerfile: str | None = None, toml: str = "",
          check: str = "/srv/pre/done") -> Path:
    """A task whose verifier looks for `check` (an absolute path, as Harbor's do)."""
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "solution").mkdir()
    (d / "instruction.md").write_text(f"Make {check}\n")
    (d / "task.toml").write_text(toml)
    (d / "tests" / "test.sh").write_text(
        f"mkdir -p /logs/verifier\nif [ -f {check} ]; then echo 1; else echo 0; fi "
        "> /logs/verifier/reward.txt\n")
    (d / "solution" / "solve.sh").write_text("touch done\n")
    if dockerfile is not None:
        (d / "environment").mkdir()
        (d / "environment" / "Dockerfile").write_text(dockerfile)
    return d


async def _oracle(box: DockerSandbox, task) -> tuple[float, float]:
    try:
        await prepare(task, box)
        empty = await verify(task, box)
        await run_solution(task, box)
        return empty.reward, (await verify(task, box)).reward
    finally:
        await box.close()


@pytest.mark.slow
def test_the_harbor_set_passes_tasks_check_in_docker(capsys) -> None:
    assert main(["tasks", "check", str(EXAMPLES), "--sandbox", "docker", "--json",
                 "--tools-dir", str(TOOLS)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) >= 8
    assert [(r["task"], r["problems"]) for r in rows if not r["ok"]] == []
    assert {(r["solution"], r["empty"]) for r in rows} == {("passes", "fails")}


async def test_the_verifier_finds_the_work_in_the_images_workdir(tmp_path: Path) -> None:
    """greeting-file's verifier reads /opt/greeter (its WORKDIR), where the image has a file
    made at build time: run as before (a host dir mounted as the workdir, environment/
    copied in) it fails; in the image's WORKDIR it passes, on the image's files as built."""
    task = load_harbor_task(EXAMPLES / "greeting-file")
    image = await Images().for_task(task)
    assert image.workdir == "/opt/greeter"
    before = await DockerSandbox.start(tmp_path, "before", image=image.name, tools=TOOLS)
    assert await _oracle(before, task) == (0.0, 0.0)
    box = await DockerSandbox.start(tmp_path, "now", image=image.name, tools=TOOLS,
                                    workdir=image.workdir)
    listed = await box.run("ls -A", timeout=30)
    built = _docker("run", "--rm", "--network", "none", image.name, "ls", "-A")
    assert listed.stdout.decode() == built.stdout == "BUILD_INFO\nREADME.md\n"
    assert (await box.run("greet you", timeout=30)).stdout == b"Hello, you! (greet 1.0.0)\n"
    assert await _oracle(box, task) == (0.0, 1.0)


async def test_a_named_image_is_used_without_a_build_or_loaded_from_its_tarball(
        tmp_path: Path) -> None:
    tag = "harnessrl-test/prebuilt:1"
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nWORKDIR /srv/pre\n"
                                        "RUN echo built-elsewhere > marker\n")
    built = _docker("build", "--network", "none", "-q", "-t", tag, str(context))
    assert built.returncode == 0, built.stderr
    image_id = _docker("image", "inspect", "-f", "{{.Id}}", tag).stdout.strip()
    # Its Dockerfile cannot build: the named image must be what is used.
    never = f"FROM {BASE_IMAGE}\nRUN echo this-was-built && exit 9\n"
    for name, ref in (("by-tag", tag), ("by-id", image_id)):
        task = load_harbor_task(_task(tmp_path, name, dockerfile=never,
                                      toml=f'[environment]\ndocker_image = "{ref}"\n'))
        image = await Images().for_task(task)
        assert (image.name, image.workdir) == (ref, "/srv/pre")
        box = await DockerSandbox.start(tmp_path, f"box-{name}", image=image.name,
                                        tools=TOOLS, workdir=image.workdir)
        assert (await box.run("cat marker", timeout=30)).stdout == b"built-elsewhere\n"
        assert await _oracle(box, task) == (0.0, 1.0)
    (tmp_path / "by-tag" / "image.tar").unlink(missing_ok=True)
    saved = _docker("save", "-o", str(tmp_path / "by-tag" / "image.tar"), tag)
    assert saved.returncode == 0, saved.stderr
    assert _docker("rmi", "-f", tag).returncode == 0
    (tmp_path / "by-tag" / "task.toml").write_text(
        f'[environment]\ndocker_image = "{tag}"\ndocker_image_archive = "image.tar"\n')
    task = load_harbor_task(tmp_path / "by-tag")
    rows = await check_tasks([task], sandbox="docker", tools=TOOLS, root=tmp_path / "check")
    assert [(r.solution, r.empty, r.problems) for r in rows] == [("passes", "fails", ())]
    assert _docker("image", "inspect", tag).returncode == 0  # loaded from the tarball
    _docker("rmi", "-f", tag)


def test_a_missing_image_or_a_failed_build_is_an_infrastructure_error(tmp_path: Path) -> None:
    """Through the runner: never a score, and the error says why."""
    from tests.docker_child import SLEEPER, install_sleeper

    tools = tmp_path / "tools"
    install_sleeper(tools)
    _task(tmp_path / "set", "absent-image",
          toml='[environment]\ndocker_image = "harnessrl-test/absent:1"\n')
    _task(tmp_path / "set", "broken-build",
          dockerfile=f"FROM {BASE_IMAGE}\nRUN echo the-step-ran && exit 7\n")
    tasks = load_tasks(tmp_path / "set")
    settings = RolloutSettings(sandbox="docker", tools_dir=str(tools), retries=0)
    config = RunSettings(harnesses=[SLEEPER], tasks=tasks, settings=settings)
    outcomes = {o.task: o for o in execute(config, oracle_engine(tasks), tmp_path / "run",
                                           console=QUIET)}
    assert {(o.status, o.verifier_reward) for o in outcomes.values()} == {
        ("infra_error", None)}
    absent = outcomes["absent-image"].error or ""
    assert "'harnessrl-test/absent:1' is not on this daemon" in absent
    assert "no docker_image_archive" in absent
    broken = outcomes["broken-build"].error or ""
    assert "did not build" in broken and "the-step-ran" in broken
    assert "returned a non-zero code: 7" in broken


async def test_builds_get_the_host_network_only_when_allowed(tmp_path: Path) -> None:
    """A daemon with no bridge: `none` (the default) or `host`, which makes no interface of
    its own (the build sees this machine's); the agent's container stays on none."""
    made = []
    for network in ("none", "host"):
        task = load_harbor_task(_task(
            tmp_path, f"net-{network}", dockerfile=(
                f"FROM {BASE_IMAGE}\nWORKDIR /srv/pre\n"  # (a step of its own: no cache)
                f"RUN echo {network} {tmp_path.name} && tail -n +3 /proc/net/dev "
                "| cut -d: -f1 | tr -d ' ' > /interfaces\n")))
        backend = DockerBackend(image=None, tools=TOOLS, build_network=network)
        box = await backend.sandbox(tmp_path, f"box-{network}", task, ())
        try:
            made.append((await box.run("cat /interfaces", timeout=30)).stdout.split())
            mode = _docker("inspect", "-f", "{{.HostConfig.NetworkMode}}", box.container)
            assert mode.stdout.strip() == "none"
        finally:
            await box.close()
        await backend.drain()
        _docker("rmi", "-f", box.image)
    host = {line.split(":")[0].strip()
            for line in Path("/proc/net/dev").read_text().splitlines()[2:]}
    assert made[0] == [b"lo"]
    assert {i.decode() for i in made[1]} == host and len(host) > 1
    with pytest.raises(ValueError, match="build_network"):
        Images(None, "bridge")  # type: ignore[arg-type]


async def test_a_mount_that_would_hide_the_workdir_fails_the_start(tmp_path: Path) -> None:
    python_home = Path(sys.prefix).resolve()
    with pytest.raises(SandboxError, match="would hide the image's WORKDIR"):
        await DockerSandbox.start(tmp_path, "hide", image=BASE_IMAGE, tools=TOOLS,
                                  workdir=str(python_home / "lib"))
    with pytest.raises(SandboxError, match="lies inside the image's WORKDIR"):
        await DockerSandbox.start(tmp_path, "add", image=BASE_IMAGE, tools=TOOLS,
                                  workdir=str(python_home.parent))


@pytest.mark.slow
@pytest.mark.harness
def test_an_oracle_run_of_the_harbor_set_in_docker(tmp_path: Path) -> None:
    """A real harness through the proxy, in each task's own image and WORKDIR."""
    from harnessrl.harnesses import get

    harness = get("mini-swe-agent")
    harness.install(TOOLS, log=lambda _line: None)
    tasks = load_tasks(EXAMPLES)
    config = RunSettings(harnesses=[harness], tasks=tasks,
                       settings=RolloutSettings(sandbox="docker", tools_dir=str(TOOLS)))
    outcomes = execute(config, oracle_engine(tasks, [harness]), tmp_path, console=QUIET)
    assert sorted((o.task, o.status, o.verifier_reward) for o in outcomes) == [
        (t.id, "done", 1.0) for t in sorted(tasks, key=lambda t: t.id)], [
        o.error for o in outcomes]


@pytest.mark.slow
async def test_generated_tasks_pass_their_check_in_docker(tmp_path: Path) -> None:
    """A sample of the generated data-analysis tasks (one per tier), in the base image."""
    from harnessrl.rollout.tasks.tablegen import TIERS, generate_sets, write_sets

    write_sets(generate_sets(5, 0, len(TIERS)), tmp_path / "set")
    tasks = load_tasks(tmp_path / "set" / "held_out")
    rows = await check_tasks(tasks, sandbox="docker", tools=TOOLS, root=tmp_path / "check")
    assert [(r.task, r.problems) for r in rows if not r.ok] == []
    assert len(rows) == len(TIERS)
