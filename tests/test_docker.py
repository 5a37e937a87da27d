"""The docker sandbox against a real daemon (started by scripts/docker.sh with no bridge),
on the offline base image. Skipped, saying why, only where no daemon can run."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harnessrl.rollout.sandbox.base import SandboxError
from harnessrl.rollout.sandbox.docker import (
    BASE_IMAGE,
    RUN_LABEL,
    ContainerLimits,
    DockerBackend,
    DockerSandbox,
    Images,
    docker,
    docker_problem,
    sweep,
)
from harnessrl.rollout.tasks.task import (
    BUNDLED,
    load_harbor_task,
    load_tasks,
    prepare,
    run_solution,
    verify,
)

TOOLS = Path("~/.cache/harnessrl/tools").expanduser()
CHILD = Path(__file__).with_name("docker_child.py")


def _problem() -> str | None:
    if (problem := docker_problem()) is not None:
        return problem
    found = subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True)
    if found.returncode != 0:
        return f"the base image {BASE_IMAGE} is missing (bash scripts/docker.sh builds it)"
    return None


PROBLEM = _problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"docker sandbox: {PROBLEM}")


def containers(filter: str) -> list[str]:
    """Container ids matching "name=..." or a label ("key" or "key=value")."""
    given = filter if filter.startswith("name=") else f"label={filter}"
    listed = subprocess.run(["docker", "ps", "-aq", "--filter", given],
                            capture_output=True, text=True, check=True)
    return listed.stdout.split()


class _Answer(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.recv(1024)
        self.request.sendall(b"HTTP/1.0 200 OK\r\n\r\nfrom-the-proxy")


@pytest.fixture
def proxy_port():
    """A stand-in for the capture proxy on host loopback (its own thread, so any event
    loop's test can reach it): answers any request."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


async def test_commands_files_env_and_timeout(tmp_path: Path, monkeypatch, proxy_port) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "planted-secret")
    box = await DockerSandbox.start(tmp_path, "box", image=BASE_IMAGE, tools=TOOLS,
                                    proxy_ports=[proxy_port])
    try:
        result = await box.run("echo hi > out.txt; env", timeout=30)
        assert result.exit_code == 0 and b"planted-secret" not in result.stdout
        assert (box.workdir / "out.txt").read_text() == "hi\n"
        started = time.monotonic()
        slow = await box.run("sleep 60 & sleep 30", timeout=2)
        assert slow.timed_out and slow.exit_code is None and time.monotonic() - started < 10
        left = await box.run("ps -eo args", timeout=10)
        assert b"sleep" not in left.stdout  # the background job died with its command
        failed = await box.run(["sh", "-c", "exit 3"], timeout=10)
        assert failed.exit_code == 3 and not failed.timed_out
    finally:
        await box.close()
    assert not box.directory.exists() and containers(f"name={box.container}") == []


async def test_only_the_proxy_is_reachable_and_writes_stay_inside(tmp_path: Path,
                                                                  proxy_port) -> None:
    other = socket.create_server(("127.0.0.1", 0))  # another host loopback service
    other_port = other.getsockname()[1]
    outside = tmp_path / "outside-the-sandbox"
    script = f"""
import socket, urllib.request
print("proxy", urllib.request.urlopen("http://127.0.0.1:{proxy_port}/", timeout=5).read())
for host, port in (("127.0.0.1", {other_port}), ("192.0.2.1", 80), ("::1", {other_port})):
    try:
        socket.create_connection((host, port), timeout=3).close()
        print("reached", host, port)
    except OSError as error:
        print("refused", host, port, type(error).__name__)
"""
    tools = tmp_path / "tools"  # its own: the shared one exists only once a harness is installed
    tools.mkdir()
    box = await DockerSandbox.start(tmp_path, "net", image=BASE_IMAGE, tools=tools,
                                    proxy_ports=[proxy_port])
    try:
        reach = await box.run(["python3", "-c", script], timeout=30)
        text = reach.stdout.decode()
        assert reach.exit_code == 0, reach.stderr
        assert "b'from-the-proxy'" in text and "reached" not in text
        assert text.count("refused") == 3
        interfaces = await box.run("cat /proc/net/dev", timeout=10)
        assert [line.split(":")[0].strip() for line in
                interfaces.stdout.decode().splitlines()[2:]] == ["lo"]
        writes = await box.run(f"mkdir -p {outside} && echo x > {outside}/f && "
                               f"echo y > /etc/planted && touch {tools}/planted", timeout=10)
        assert writes.exit_code != 0 and b"Read-only file system" in writes.stderr
        assert (await box.run("cat /etc/planted", timeout=10)).stdout == b"y\n"
    finally:
        await box.close()
        other.close()
    assert not outside.exists() and not Path("/etc/planted").exists()
    assert not (TOOLS / "planted").exists()


@pytest.mark.slow
async def test_oracle_passes_and_empty_attempt_fails_on_every_bundled_task(
        tmp_path: Path, proxy_port) -> None:
    """Each bundled task's own image (built from its Dockerfile FROM the base image): the
    untouched workdir scores 0, the reference solution 1, in the same container."""
    tasks = load_tasks("bundled")
    assert len(tasks) == 32 and all(t.dockerfile is not None for t in tasks)
    label = str(tmp_path)
    backend = DockerBackend(image=None, tools=TOOLS, starts=2, run_label=label)

    async def one(task) -> tuple[str, float, float]:
        box = await backend.sandbox(tmp_path, task.id, task, [proxy_port])
        try:
            await prepare(task, box)
            empty = await verify(task, box)
            await run_solution(task, box)
            solved = await verify(task, box)
        finally:
            await box.close()
        assert box.image.startswith(f"harnessrl-task/{task.id}:")
        return task.id, empty.reward, solved.reward

    gate = asyncio.Semaphore(2)

    async def gated(task):
        async with gate:
            return await one(task)

    results = await asyncio.gather(*(gated(t) for t in tasks))
    assert [r for r in results if (r[1], r[2]) != (0.0, 1.0)] == []
    await backend.drain()  # a backend's sandboxes are removed in the background
    assert containers(f"{RUN_LABEL}={label}") == []


async def test_limits_come_from_task_toml(tmp_path: Path, proxy_port) -> None:
    task = load_harbor_task(BUNDLED / "fizzbuzz")
    limits = ContainerLimits.of(task)
    assert (limits.cpus, limits.memory_mb) == (1.0, 2048)
    box = await DockerSandbox.start(tmp_path, "lim", image=BASE_IMAGE, tools=TOOLS,
                                    proxy_ports=[proxy_port], limits=limits)
    try:
        shown = await docker("inspect", "-f", "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}} "
                             "{{.HostConfig.NetworkMode}}", box.container)
        assert shown.stdout.split() == [str(10**9), str(2048 << 20), "none"]
    finally:
        await box.close()


async def test_container_starts_are_capped(tmp_path: Path, proxy_port, monkeypatch) -> None:
    busy, peak = 0, 0
    real = DockerSandbox.start.__func__  # type: ignore[attr-defined]

    async def counted(cls, *args, **kwargs):
        nonlocal busy, peak
        busy += 1
        peak = max(peak, busy)
        try:
            return await real(cls, *args, **kwargs)
        finally:
            busy -= 1

    monkeypatch.setattr(DockerSandbox, "start", classmethod(counted))
    backend = DockerBackend(image=BASE_IMAGE, tools=TOOLS, starts=1)
    task = load_harbor_task(BUNDLED / "fizzbuzz")
    boxes = await asyncio.gather(*(backend.sandbox(tmp_path, f"cap{i}", task, [proxy_port])
                                   for i in range(3)))
    for box in boxes:
        await box.close()
    assert peak == 1
    await backend.drain()  # close() left `docker rm` running; drain waits for all three
    assert [c for box in boxes for c in containers(f"name={box.container}")] == []
    assert not any(box.directory.exists() for box in boxes)


async def test_a_proxy_the_relay_cannot_reach_fails_the_start(tmp_path: Path) -> None:
    """The self-check runs as the container's first process: its report names the port."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(SandboxError, match=f"port {port}: the relay"):
        await DockerSandbox.start(tmp_path, "noproxy", image=BASE_IMAGE, tools=TOOLS,
                                  proxy_ports=[port])
    assert containers("name=harnessrl-noproxy") == []


async def test_bad_dockerfile_and_missing_image_are_infrastructure_errors(tmp_path: Path) -> None:
    task_dir = tmp_path / "broken-task"
    (task_dir / "environment").mkdir(parents=True)
    (task_dir / "tests").mkdir()
    (task_dir / "tests" / "test.sh").write_text("exit 0\n")
    (task_dir / "instruction.md").write_text("nothing\n")
    (task_dir / "task.toml").write_text("")
    (task_dir / "environment" / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nRUN echo the-build-step-ran && exit 7\n")
    task = load_harbor_task(task_dir)
    images = Images()
    before = set(containers("name="))
    for _ in range(2):  # the second time from the remembered failure
        with pytest.raises(SandboxError) as failed:
            await images.for_task(task)
        assert "did not build" in str(failed.value) and "the-build-step-ran" in str(failed.value)
        assert "returned a non-zero code: 7" in str(failed.value)
    assert set(containers("name=")) - before == set()  # the failed step's container is gone
    with pytest.raises(SandboxError, match="'no-such/image:1' does not exist"):
        await Images("no-such/image:1").for_task(task)


async def test_an_image_that_cannot_run_the_runtimes_says_so(tmp_path: Path,
                                                             proxy_port) -> None:
    """An image without a libc (one file in it): the mounted Python cannot start."""
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "marker").write_text("x")
    imported = subprocess.run(f"tar -C {tmp_path / 'ctx'} -c . | docker import - "
                              "harnessrl-test/no-libc:1", shell=True, capture_output=True)
    assert imported.returncode == 0, imported.stderr
    with pytest.raises(SandboxError, match="cannot run the sandbox's runtimes"):
        await DockerSandbox.start(tmp_path, "nolibc", image="harnessrl-test/no-libc:1",
                                  tools=TOOLS, proxy_ports=[proxy_port])
    assert containers("name=harnessrl-nolibc") == []


def _start_child(run_dir: Path, tools: Path) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, str(CHILD), str(run_dir), str(tools)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    label = f"{RUN_LABEL}={run_dir.resolve()}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if containers(label) and _agent_running(run_dir):
            return child
        assert child.poll() is None, child.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
        time.sleep(0.3)
    child.kill()
    raise AssertionError("the runner never got its agent running in a container")


def _agent_running(run_dir: Path) -> bool:
    """A `sleep 600` whose HOME is a sandbox of this run (its cwd is the image's WORKDIR,
    inside the container's own filesystem)."""
    found = subprocess.run(["pgrep", "-f", "sleep 600"], capture_output=True, text=True)
    return any(_home(pid).is_relative_to(run_dir.resolve()) for pid in found.stdout.split())


def _home(pid: str) -> Path:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return Path("/nowhere")
    return next((Path(v[5:].decode()) for v in environ if v.startswith(b"HOME=")),
                Path("/nowhere"))


@pytest.mark.slow
def test_sigterm_removes_the_runners_containers(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    child = _start_child(run_dir, tmp_path / "tools")
    child.send_signal(signal.SIGTERM)
    started = time.monotonic()
    while containers(f"{RUN_LABEL}={run_dir.resolve()}") and time.monotonic() - started < 10:
        time.sleep(0.2)
    assert containers(f"{RUN_LABEL}={run_dir.resolve()}") == []
    assert child.wait(timeout=20) != 0


@pytest.mark.slow
async def test_after_sigkill_the_next_start_sweeps_the_leftovers(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    child = _start_child(run_dir, tmp_path / "tools")
    # Its watcher first: it would remove the container when the runner dies (that is
    # tested in test_sandbox_owners.py); here nothing but the sweep may.
    watcher = subprocess.run(["pkill", "-KILL", "-f",
                              f"reaper_launcher.py --owner {child.pid} --docker-label"])
    assert watcher.returncode == 0, "the runner started no container watcher"
    child.kill()
    child.wait(timeout=20)
    label = f"{RUN_LABEL}={run_dir.resolve()}"
    assert len(containers(label)) == 1  # nothing ran to remove it
    removed = await sweep()
    assert containers(label) == [] and len(removed) >= 1


@pytest.mark.slow
@pytest.mark.harness
@pytest.mark.parametrize("name", ["pi", "mini-swe-agent"])  # one Node, one Python harness
def test_real_harness_through_the_proxy_from_inside_a_container(name: str,
                                                                tmp_path: Path) -> None:
    from rich.console import Console

    from harnessrl.harnesses import get
    from harnessrl.rollout.run import execute, oracle_engine
    from harnessrl.rollout.runner import RolloutSettings, RunSettings
    from harnessrl.store.reader import TraceReader

    harness = get(name)
    harness.install(TOOLS, log=lambda _line: None)
    tasks = load_tasks("bundled:count-error-lines")
    config = RunSettings(harnesses=[harness], tasks=tasks,
                       settings=RolloutSettings(sandbox="docker", tools_dir=str(TOOLS)))
    quiet = Console(file=open(os.devnull, "w"))  # noqa: SIM115
    outcomes = execute(config, oracle_engine(tasks, [harness]), tmp_path, console=quiet)
    assert [(o.status, o.verifier_reward, o.sandbox) for o in outcomes] == [
        ("done", 1.0, "docker")], [o.error for o in outcomes]
    with TraceReader(tmp_path) as store:  # the agent's model calls went through the proxy
        assert all(len(store.turns(o.rollout)) >= harness.min_turns for o in outcomes)
    assert containers(f"{RUN_LABEL}={tmp_path.resolve()}") == []


def test_the_daemon_scripts_docker_sh_starts_has_no_bridge() -> None:
    """Started by scripts/docker.sh: no bridge network and no iptables rules of its own,
    so nothing here ever routes to a private-range address."""
    pidfile = Path("~/.cache/harnessrl/docker/dockerd.pid").expanduser()
    pid = pidfile.read_text().strip() if pidfile.is_file() else ""
    if not pid.isdigit() or not Path(f"/proc/{pid}").exists():
        pytest.skip("this daemon was not started by scripts/docker.sh")
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"--bridge=none" in args and b"--iptables=false" in args
    bridges = subprocess.run(["docker", "network", "ls", "-q", "--filter", "driver=bridge"],
                             capture_output=True, text=True, check=True)
    assert bridges.stdout.split() == []
