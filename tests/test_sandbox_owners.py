"""No sandbox outlives its run: a runner killed with SIGKILL takes its sandboxes' processes
with it (reaper_launcher.py), what a dead runner left is swept at the next runner start and
by `harnessrl sandboxes --remove` (rollout/sandbox/owners.py), local and Docker alike."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harnessrl.rollout.sandbox import owners

CHILD = Path(__file__).with_name("sandbox_child.py")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def registry(tmp_path: Path, monkeypatch) -> Path:
    """A registry of this test's own (the machine's is shared with other runs)."""
    folder = tmp_path / "registry"
    monkeypatch.setenv(owners.REGISTRY_ENV, str(folder))
    return folder


def _env(registry: Path) -> dict[str, str]:
    return {**os.environ, owners.REGISTRY_ENV: str(registry),
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}


def _until(check, seconds: float, what: str, child: subprocess.Popen | None = None):
    """check()'s first true value; fails after `seconds`, or when `child` has ended."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found := check():
            return found
        if child is not None and child.poll() is not None:
            assert child.stderr is not None
            raise AssertionError(f"the command ended ({child.returncode}) before {what}: "
                                 f"{child.stderr.read().decode()[-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds:.0f} s: {what}")


def _homes_under(root: Path) -> list[int]:
    """Processes whose HOME lies under `root` (a sandbox's agent and what it started)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        homes = [Path(v[5:].decode()) for v in environ if v.startswith(b"HOME=")]
        if homes and homes[0].is_relative_to(root.resolve()):
            found.append(int(entry.name))
    return found


RUNNER = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from harnessrl.rollout.sandbox.local import LocalSandbox

    async def main():
        box = await LocalSandbox.create(Path(sys.argv[1]), "box")
        print("started", flush=True)
        await box.run("setsid sleep 300 & exec sleep 300", timeout=600)

    asyncio.run(main())
""")


def _start_runner(root: Path, registry: Path) -> tuple[subprocess.Popen, owners.Entry]:
    child = subprocess.Popen([sys.executable, "-c", RUNNER, str(root)], env=_env(registry),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    entry = _until(lambda: next(iter(owners.entries()), None), 60, "the sandbox registered")
    _until(lambda: len(owners.marked(entry.token)) >= 3, 60,
           "the reaper, the command and the process that left its group running")
    return child, entry


def test_a_sigkilled_runner_takes_its_sandbox_commands_with_it(tmp_path, registry, capsys):
    from harnessrl.cli import main

    child, entry = _start_runner(tmp_path / "root", registry)
    assert entry.owner == f"{child.pid}:{owners.start_time(child.pid)}"
    assert entry.here() and not entry.left_over()
    child.kill()
    child.wait()
    # the reaper saw its owner die: the command and the one that left its group are gone
    _until(lambda: not owners.marked(entry.token), 10, "the sandbox's processes killed")
    # the directories and the entry are what a dead runner leaves: listed, then removed
    assert Path(entry.directory).is_dir() and owners.entries()[0].left_over()
    assert main(["sandboxes"]) == 0
    out, err = capsys.readouterr()
    assert f"left-over pid {child.pid}" in out and entry.directory in out
    assert "1 left over" in err
    assert main(["sandboxes", "--remove", "--json"]) == 0
    (shown,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert shown["state"] == "removed" and shown["token"] == entry.token
    assert not Path(entry.directory).exists() and not Path(entry.private).exists()
    assert owners.entries() == []


def _dead_entry(tmp_path: Path, namespace: str | None = None) -> tuple[owners.Entry,
                                                                       subprocess.Popen]:
    """A sandbox whose watcher could not kill it (killed too): a marked process running,
    registered to an owner that is gone (this pid with another start time)."""
    token = secrets.token_hex(12)  # this run's own: no other run's process has it
    directory, private = tmp_path / "sandboxes" / "box", tmp_path / "private"
    for folder in (directory / "work", private):
        folder.mkdir(parents=True)
    process = subprocess.Popen(["sleep", "300"], env={owners.MARKER: token},
                               start_new_session=True)
    owners.register(token, directory, private)
    path = owners.registry_dir() / f"{token}.json"
    entry = json.loads(path.read_text())
    entry["owner"] = f"{os.getpid()}:1"  # the pid of a process long gone
    if namespace is not None:
        entry["namespace"] = namespace
    path.write_text(json.dumps(entry))
    return owners.entries()[0], process


def test_a_runner_start_sweeps_what_a_dead_owner_left(tmp_path, registry):
    from harnessrl.rollout.runner import Runner, RunSettings
    from harnessrl.store.writer import TraceStore

    entry, process = _dead_entry(tmp_path)
    assert entry.left_over() and owners.marked(entry.token) == [process.pid]
    with TraceStore(tmp_path / "run") as store:
        Runner(RunSettings(harnesses=[], tasks=[]), store, "http://127.0.0.1:1",
               tmp_path / "run")
    assert process.wait(timeout=10) == -signal.SIGKILL
    assert not Path(entry.directory).exists() and not Path(entry.private).exists()
    assert owners.entries() == []


def test_entries_of_another_pid_namespace_are_listed_never_removed(tmp_path, registry,
                                                                   capsys):
    from harnessrl.cli import main

    entry, process = _dead_entry(tmp_path, namespace="another-boot:pid:[1]")
    try:
        assert not entry.left_over() and owners.sweep() == []
        assert main(["sandboxes", "--remove"]) == 0
        assert capsys.readouterr().out.startswith("elsewhere")
        assert process.poll() is None and Path(entry.directory).is_dir()
    finally:
        process.kill()
        process.wait()


async def test_the_reaper_passes_exit_codes_and_signals_through(tmp_path, registry):
    from harnessrl.rollout.sandbox.local import LocalSandbox

    async with await LocalSandbox.create(tmp_path, "box") as box:
        assert (await box.run("exit 3", timeout=30)).exit_code == 3
        assert (await box.run("kill -TERM $$", timeout=30)).exit_code == -signal.SIGTERM
        assert (await box.run("kill -KILL $$", timeout=30)).exit_code == -signal.SIGKILL
        missing = await box.run(["no-such-program-here"], timeout=30)
        assert missing.exit_code == 127 and b"no-such-program-here" in missing.stderr
        assert len(owners.entries()) == 1
    assert owners.entries() == []  # closed: unregistered


# -- whole commands, killed ------------------------------------------------------------------

@pytest.fixture
def fake_engine():
    """A stand-in for vLLM in dev mode that the trainer can start against and sync its
    weights to (the sleeping agent never asks it for a completion)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from harnessrl.proxy.serve import in_thread

    served = {"weight_version": None}

    async def models(_request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "policy", "object": "model"}]})

    async def weight_info(_request: Request) -> JSONResponse:
        return JSONResponse(served)

    async def posted(request: Request) -> JSONResponse:
        if request.url.path == "/update_weight_version":
            served["weight_version"] = (await request.json())["new_version"]
        return JSONResponse({})

    app = Starlette(routes=[
        Route("/v1/models", models), Route("/weight_info", weight_info),
        *(Route(path, posted, methods=["POST"]) for path in
          ("/collective_rpc", "/reset_prefix_cache", "/update_weight_version"))])
    with in_thread(app) as (url, _server):
        yield url


def test_sigkilled_harnessrl_run_leaves_no_harness_process(tmp_path, registry, capsys):
    """`harnessrl run` (the oracle engine: no model) with two sleeping agents, SIGKILLed."""
    from harnessrl.cli import main

    run_dir, tools = tmp_path / "run", tmp_path / "tools"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "hello", "instruction": "Create hello.txt",
                                 "verify": ["test -f hello.txt"], "timeout": 600}))
    child = subprocess.Popen([sys.executable, str(CHILD), str(tools), "run", "--harness",
                              "sleeper", "--tasks", str(tasks), "--oracle", "--no-hide",
                              "-k", "2", "--retries", "0", "--tools-dir", str(tools),
                              "--run-dir", str(run_dir)], env=_env(registry),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:  # each rollout: the reaper, the agent and the sleep that left its group
        _until(lambda: len(_homes_under(run_dir)) >= 6, 120, "both agents running", child)
    finally:
        child.kill()
        child.wait()
    _until(lambda: not _homes_under(run_dir), 10, "no harness process of the run left")
    assert main(["sandboxes", "--remove"]) == 0
    assert capsys.readouterr().out.count("removed   pid") == 2
    assert owners.entries() == [] and not list((run_dir / "sandboxes").iterdir())


@pytest.mark.slow
def test_sigkilled_harnessrl_train_leaves_no_harness_process(tmp_path, registry, tiny_model,
                                                            fake_engine):
    run_dir = tmp_path / "run"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "hello", "instruction": "Create hello.txt",
                                 "verify": ["test -f hello.txt"], "timeout": 600}))
    config = tmp_path / "train.yaml"
    config.write_text(f"""
run_dir: {run_dir}
model: {{path: "{tiny_model}"}}
engine: {{url: "{fake_engine}/v1", max_tokens: 32}}
rollout: {{harnesses: [sleeper], tasks: "{tasks}", tools_dir: "{tmp_path / 'tools'}",
          hide_host: false, concurrency: 2}}
grpo: {{trainer: sync, steps: 1, num_generations: 2, tasks_per_step: 1}}
""")
    child = subprocess.Popen([sys.executable, str(CHILD), str(tmp_path / "tools"), "train",
                              "--config", str(config)], env=_env(registry),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # two rollouts, each an agent and the sleep that left its process group
        _until(lambda: len(_homes_under(run_dir)) >= 4, 300, "the trainer's agents running",
               child)
    finally:
        child.kill()
        child.wait()
    _until(lambda: not _homes_under(run_dir), 10, "no harness process of the run left")
    assert all(e.left_over() for e in owners.entries()) and len(owners.entries()) == 2
    owners.sweep()  # what the next start does
    assert owners.entries() == [] and not list((run_dir / "sandboxes").iterdir())


def _docker_problem() -> str | None:
    from harnessrl.rollout.sandbox.docker import BASE_IMAGE, docker_problem

    if (problem := docker_problem()) is not None:
        return problem
    found = subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True)
    return None if found.returncode == 0 else f"the base image {BASE_IMAGE} is missing"


def _containers(label: str) -> list[str]:
    listed = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={label}"],
                            capture_output=True, text=True, check=True)
    return listed.stdout.split()


def _watcher_of(pid: int) -> list[int]:
    """The Docker watcher (reaper_launcher.py --docker-label) of runner `pid`."""
    found = []
    for entry in os.scandir("/proc"):
        try:
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--docker-label" in argv and f"{owners.LABEL}={pid}:".encode() in b" ".join(argv):
            found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("watcher", ["alive", "killed too"])
def test_after_sigkill_of_harnessrl_run_no_container_is_left(watcher, tmp_path, registry):
    """With its watcher the runner's container goes at once; with the watcher killed too
    (a lost node), the next runner start sweeps it."""
    if (problem := _docker_problem()) is not None:
        pytest.skip(f"docker sandbox: {problem}")
    from harnessrl.rollout.runner import Runner, RunSettings
    from harnessrl.rollout.sandbox.docker import RUN_LABEL
    from harnessrl.store.writer import TraceStore

    run_dir = tmp_path / "run"
    label = f"{RUN_LABEL}={run_dir.resolve()}"
    child = subprocess.Popen([sys.executable, str(CHILD), str(tmp_path / "tools"), "run",
                              "--harness", "sleeper", "--tasks", "bundled:fizzbuzz",
                              "--oracle", "--sandbox", "docker", "--retries", "0",
                              "--tools-dir", str(tmp_path / "tools"), "--run-dir",
                              str(run_dir)], env=_env(registry),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _until(lambda: _containers(label) and _homes_under(run_dir), 180,
               "the agent running in its container", child)
        (entry,) = owners.entries()
        assert entry.container and _containers(label)
        watchers = _watcher_of(child.pid)
        assert len(watchers) == 1
    finally:
        child.kill()
        child.wait()
    if watcher == "alive":
        _until(lambda: not _containers(label), 60, "the watcher removed the container")
    else:
        os.kill(watchers[0], signal.SIGKILL)
        time.sleep(1)
        assert _containers(label)  # nothing ran to remove it
    with TraceStore(tmp_path / "next") as store:  # the next start
        Runner(RunSettings(harnesses=[], tasks=[]), store, "http://127.0.0.1:1",
               tmp_path / "next")
    assert _containers(label) == [] and owners.entries() == []
    assert not _homes_under(run_dir)
