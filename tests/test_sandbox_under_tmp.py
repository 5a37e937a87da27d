"""The confined sandbox when what it needs lives under /tmp (a clone under /tmp, its .venv,
a harness prefix or task kept there), and sandboxes and verifiers that cannot run: an
infrastructure error that says why, never a scored rollout.

The /tmp case runs the sandbox from a driver process whose interpreter is a venv made under
/tmp, the way a user's clone under /tmp runs it."""

from __future__ import annotations

import json
import os
import shutil
import site
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import harnessrl
from harnessrl.rollout.sandbox.base import SandboxError
from harnessrl.rollout.sandbox.local import LocalSandbox
from harnessrl.rollout.tasks import task as tasks_module
from harnessrl.rollout.tasks.task import BUNDLED, load_harbor_task, verify

needs_confinement = pytest.mark.skipif(
    not (LocalSandbox.confinement_available() and LocalSandbox.network_isolation_available()),
    reason="needs a mount and a network namespace (root)")

DRIVER = textwrap.dedent('''
    import asyncio, json, os, sys
    from pathlib import Path
    from harnessrl.rollout.sandbox.local import LocalSandbox
    from harnessrl.rollout.tasks.task import load_harbor_task, verify

    CONNECT = ("import socket, sys; s = socket.create_connection(('127.0.0.1', "
               "int(sys.argv[1])), timeout=5); s.sendall(b'ping\\\\n'); "
               "print(s.makefile('rb').readline().decode().strip())")

    async def echo(reader, writer):
        writer.write(b"echo:" + await reader.readline())
        await writer.drain()
        writer.close()

    async def main(base: Path) -> dict:
        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        prefix, task_dir = base / "prefix", base / "task"
        box = await LocalSandbox.create(
            base / "sandboxes", "box", network="loopback-proxy", proxy_ports=[port],
            hide=[task_dir, base / "sandboxes"], show=[prefix])
        env = {"PATH": f"{prefix}/bin:{os.environ['PATH']}"}
        async def out(command):
            result = await box.run(command, env=env, timeout=60)
            return (result.stdout + result.stderr).decode().strip()
        try:
            (box.workdir / "answer.txt").write_text("42\\n")
            verdict = await verify(load_harbor_task(task_dir), box)
            return {
                "harness": await out("hello"),
                "python": await out([sys.executable, "-c", "import sys; print(sys.prefix)"]),
                "relay": await out([sys.executable, "-c", CONNECT, str(port)]),
                "task_hidden": await out(
                    f"cat {task_dir}/tests/test_answer.py 2>/dev/null || echo unseen"),
                "secret": await out(f"cat {base}/secret.txt 2>/dev/null || echo unseen"),
                "prefix_write": await out(f"touch {prefix}/bin/new 2>/dev/null || echo refused"),
                "tmp_write": await out("echo mine > /tmp/t && cat /tmp/t"),
                "tmp_lands": (box.tmp / "t").read_text().strip(),
                "verdict": [verdict.status, verdict.reward, verdict.output[-300:]],
            }
        finally:
            await box.close()
            server.close()

    print(json.dumps(asyncio.run(main(Path(sys.argv[1])))))
''')


def _harbor_task(directory: Path) -> None:
    """A Harbor task with the bundled verifier (test.sh + run_tests.py): passes when the
    agent left answer.txt with 42."""
    (directory / "environment").mkdir(parents=True)
    (directory / "instruction.md").write_text("Write 42 to answer.txt.\n")
    (directory / "task.toml").write_text('version = "1.0"\n')
    shutil.copytree(BUNDLED / "lru-cache" / "tests", directory / "tests")
    for old in (directory / "tests").glob("test_*.py"):
        old.unlink()
    (directory / "tests" / "test_answer.py").write_text(
        "import os\n\ndef test_answer():\n    with open(os.path.join(os.environ['WORKDIR'], "
        "'answer.txt')) as f:\n        assert f.read().strip() == '42'\n")


@pytest.fixture(scope="module")
def under_tmp() -> Iterator[Path]:
    """/tmp/hrl-…: a venv whose python sees this checkout's packages, a harness prefix, a
    task, and a file the sandbox must not see."""
    base = Path(tempfile.mkdtemp(prefix="hrl-undertmp-", dir="/tmp"))
    base_python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}"
    subprocess.run([str(base_python), "-m", "venv", "--without-pip", str(base / "venv")],
                   check=True)
    venv_site = next((base / "venv" / "lib").glob("python3*/site-packages"))
    source = Path(harnessrl.__file__).resolve().parents[1]
    (venv_site / "checkout.pth").write_text(
        "\n".join([str(source), *site.getsitepackages()]) + "\n")
    (base / "prefix" / "bin").mkdir(parents=True)
    hello = base / "prefix" / "bin" / "hello"
    hello.write_text("#!/bin/sh\necho hello-from-the-prefix\n")
    hello.chmod(0o755)
    _harbor_task(base / "task")
    (base / "secret.txt").write_text("host secret\n")
    yield base
    shutil.rmtree(base, ignore_errors=True)


@needs_confinement
def test_confined_sandbox_keeps_what_lives_under_tmp(under_tmp: Path):
    """Interpreter, import path, harness prefix and task under /tmp: the launch chain runs,
    the verifier scores, the relay reaches the proxy; the rest of /tmp is the sandbox's."""
    python = under_tmp / "venv" / "bin" / "python"
    done = subprocess.run([str(python), "-c", DRIVER, str(under_tmp)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["harness"] == "hello-from-the-prefix"
    assert seen["python"] == str(under_tmp / "venv")
    assert seen["relay"] == "echo:ping"
    assert seen["verdict"][:2] == ["scored", 1.0], seen["verdict"]
    assert seen["task_hidden"].endswith("unseen")  # the task's tests stay hidden
    assert seen["secret"].endswith("unseen")  # the rest of /tmp is not the host's
    assert seen["prefix_write"].endswith("refused")  # shown read-only
    assert seen["tmp_write"] == "mine" and seen["tmp_lands"] == "mine"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@needs_confinement
async def test_a_sandbox_whose_relay_reaches_nothing_fails_at_creation(tmp_path: Path):
    with pytest.raises(SandboxError, match=r"self-check.*unreachable|self-check.*closed"):
        await LocalSandbox.create(tmp_path, "box", network="loopback-proxy",
                                  proxy_ports=[_closed_port()], confine=True)
    assert not (tmp_path / "box").exists()  # cleaned up


@needs_confinement
async def test_a_sandbox_missing_a_path_it_needs_fails_at_creation(tmp_path: Path,
                                                                   monkeypatch):
    """A needed path the confined namespace cannot show is named in the error."""
    missing = tmp_path / "gone"
    missing.mkdir()
    real = LocalSandbox._needed

    def needed(self: LocalSandbox, env) -> list[str]:
        return [*real(self, env), str(missing)]

    monkeypatch.setattr(LocalSandbox, "_needed", needed)
    # hidden: the probe must find it missing (its parent, not it, is what is hidden)
    with pytest.raises(SandboxError, match=f"missing inside the sandbox: {missing}"):
        await LocalSandbox.create(tmp_path / "boxes", "box", hide=[tmp_path])


async def test_a_verifier_whose_interpreter_is_missing_is_not_scored(tmp_path: Path,
                                                                     monkeypatch):
    _harbor_task(tmp_path / "task")
    task = load_harbor_task(tmp_path / "task")
    env = tasks_module.Layout.env
    monkeypatch.setattr(tasks_module.Layout, "env",
                        lambda self: env(self) | {"PYTHON": str(tmp_path / "no" / "python")})
    async with await LocalSandbox.create(tmp_path / "boxes", "box") as box:
        (box.workdir / "answer.txt").write_text("42\n")
        verdict = await verify(task, box)
    assert verdict.status == "not_run", verdict
    assert str(tmp_path / "no" / "python") in (verdict.reason or "")


async def test_a_verifier_that_cannot_import_pytest_is_not_scored(tmp_path: Path,
                                                                  monkeypatch):
    """The interpreter is there, its test runner is not (a bare venv)."""
    subprocess.run([str(Path(sys.base_prefix) / "bin" / "python3"), "-m", "venv",
                    "--without-pip", str(tmp_path / "bare")], check=True)
    _harbor_task(tmp_path / "task")
    task = load_harbor_task(tmp_path / "task")
    env = tasks_module.Layout.env
    monkeypatch.setattr(tasks_module.Layout, "env",
                        lambda self: env(self) | {"PYTHON": str(tmp_path / "bare/bin/python")})
    async with await LocalSandbox.create(tmp_path / "boxes", "box") as box:
        verdict = await verify(task, box)
    assert verdict.status == "not_run" and "cannot import pytest" in (verdict.reason or "")


async def test_the_bundled_verifier_reports_a_missing_runner_without_a_reward(tmp_path: Path):
    """test.sh itself, past the pre-check: 127 from the interpreter is no reward, not 0."""
    _harbor_task(tmp_path / "task")
    async with await LocalSandbox.create(tmp_path / "boxes", "box") as box:
        result = await box.run(["bash", str(tmp_path / "task" / "tests" / "test.sh")],
                               env={"PYTHON": str(tmp_path / "nowhere"),
                                    "TESTS_DIR": str(tmp_path / "task" / "tests"),
                                    "LOGS_DIR": str(box.directory / "logs")}, timeout=60)
        assert result.exit_code == 127
        assert not (box.directory / "logs" / "reward.txt").exists()


def test_a_tmp_directory_itself_is_never_shown_back():
    """/tmp on a PATH, however spelled, stays the sandbox's own tmp/; what lies below it
    is shown once, outermost first."""
    from harnessrl.rollout.sandbox.confine_launcher import _covered

    base = tempfile.mkdtemp(prefix="hrl-covered-", dir="/tmp")
    try:
        os.makedirs(f"{base}/a/b")
        assert _covered(["/tmp/", "/tmp/.", "/tmp", f"{base}/a/b", f"{base}/a/", "/usr"]) == [
            f"{base}/a"]
    finally:
        shutil.rmtree(base)


@pytest.mark.parametrize(("still_mounted", "raises"), [(False, False), (True, True)])
def test_a_mount_that_vanished_before_its_read_only_remount_is_skipped(monkeypatch,
                                                                       still_mounted, raises):
    """A container's overlay listed in the mount table, gone by the time it is remounted
    read-only (Docker stopped the container meanwhile): nothing left to protect, so the
    sandbox starts; a mount still there that cannot be made read-only stops it."""
    from harnessrl.rollout.sandbox import confine_launcher

    point = "/var/lib/docker/overlay2/abc/merged"

    def mount(*args: str) -> None:
        raise subprocess.CalledProcessError(32, ["mount", *args])

    monkeypatch.setattr(confine_launcher, "mount", mount)
    monkeypatch.setattr(confine_launcher, "_mount_points",
                        lambda: ["/", point] if still_mounted else ["/"])
    if raises:
        with pytest.raises(subprocess.CalledProcessError):
            confine_launcher._read_only(point)
    else:
        confine_launcher._read_only(point)
