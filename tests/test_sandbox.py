"""The local sandbox: environment scrubbing, process-tree kills, rlimits, files, isolation."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from harnessrl.rollout.sandbox import local as sandbox_module
from harnessrl.rollout.sandbox import owners
from harnessrl.rollout.sandbox.base import Limits, NetworkIsolationUnavailable, SandboxError
from harnessrl.rollout.sandbox.local import LocalSandbox

SECRETS = {"AWS_SECRET_ACCESS_KEY": "aws-secret", "GITHUB_TOKEN": "gh-token",
           "OPENAI_API_KEY": "sk-secret", "HTTPS_PROXY": "http://proxy.invalid:3128",
           "http_proxy": "http://proxy.invalid:3128", "NO_PROXY": "*"}

needs_netns = pytest.mark.skipif(
    not LocalSandbox.network_isolation_available(),
    reason=f"network isolation unavailable: {LocalSandbox.network_isolation_problem()}")


@pytest.fixture
async def box(tmp_path: Path):
    sandbox = await LocalSandbox.create(tmp_path / "sandboxes", "box", kill_grace=0.5)
    yield sandbox
    await sandbox.close()


def live_processes(needle: str, within: float = 5.0) -> list[int]:
    """Processes (not zombies) whose command line contains `needle`, once none is left or
    `within` seconds have passed: SIGKILL is sent at once, but a process dies only when
    it next runs, which on a loaded machine can take a moment."""
    deadline = time.monotonic() + within
    while (found := _live(needle)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def _live(needle: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


# -- environment -----------------------------------------------------------------------------

async def test_host_secrets_and_proxies_never_pass(monkeypatch, tmp_path: Path):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    async with await LocalSandbox.create(tmp_path, "env", allowed_env={"KEEP": "yes"}) as box:
        result = await box.run("env", env={"PER_RUN": "1"}, timeout=10)
    shown = dict(line.split("=", 1) for line in result.stdout.decode().splitlines())
    assert not set(SECRETS) & set(shown)
    assert not any(value in result.stdout.decode() for value in SECRETS.values())
    assert set(shown) <= {"PATH", "HOME", "LANG", "TMPDIR", "KEEP", "PER_RUN", "PWD", "SHLVL",
                          "_", owners.MARKER}
    assert shown["HOME"] == str(box.home) and shown["TMPDIR"] == str(box.tmp)
    assert shown["KEEP"] == "yes" and shown["PER_RUN"] == "1"


async def test_proxy_variables_are_refused_even_when_named(tmp_path: Path, box: LocalSandbox):
    with pytest.raises(ValueError, match="HTTPS_PROXY"):
        await LocalSandbox.create(tmp_path, "p", allowed_env={"HTTPS_PROXY": "x"})
    with pytest.raises(ValueError, match="all_proxy"):
        await box.run("true", env={"all_proxy": "x"}, timeout=5)


async def test_workdir_home_and_exit_codes(box: LocalSandbox):
    result = await box.run("pwd; echo err >&2; exit 3", timeout=10)
    assert result.stdout.decode().strip() == str(box.workdir)
    assert result.stderr == b"err\n" and result.exit_code == 3 and not result.timed_out
    listed = await box.run(["ls", "-a"], timeout=10, cwd=box.home)
    assert listed.exit_code == 0 and listed.stdout.split() == [b".", b".."]


# -- process trees ---------------------------------------------------------------------------

async def test_timeout_kills_the_whole_process_group(box: LocalSandbox):
    # a child shell that starts a grandchild, plus a grandchild that ignores SIGTERM
    command = ("sh -c 'sleep 987.123' & "
               "sh -c 'trap \"\" TERM; sleep 987.124' & "
               "sleep 987.125")
    result = await box.run(command, timeout=1)
    assert result.timed_out and result.exit_code is None
    assert 1 <= result.seconds < 15  # timeout + kill grace, with room for a loaded machine
    assert live_processes("987.12") == []


async def test_leftovers_die_when_the_command_ends(box: LocalSandbox):
    result = await box.run("sleep 986.5 & setsid sleep 986.6 & echo started", timeout=10)
    assert result.exit_code == 0 and result.stdout == b"started\n"
    assert result.seconds < 8  # background jobs holding the output do not delay the result
    assert live_processes("986.") == []


async def test_cancelling_a_run_kills_its_processes(box: LocalSandbox):
    task = asyncio.create_task(box.run("sleep 985.5", timeout=60))
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert live_processes("985.5") == []


# -- rlimits ---------------------------------------------------------------------------------

async def test_rlimits_apply(tmp_path: Path):
    limits = Limits(cpu_seconds=1, memory_bytes=256 << 20, open_files=64,
                    file_size_bytes=1 << 20)
    async with await LocalSandbox.create(tmp_path, "limits", limits=limits) as box:
        nofile = await box.run("ulimit -n", timeout=10)
        assert nofile.stdout.strip() == b"64"
        big = await box.run("head -c 3000000 /dev/zero > big", timeout=10)
        assert big.exit_code != 0 and (box.workdir / "big").stat().st_size <= 1 << 20
        memory = await box.run([sys.executable, "-c", "x = bytearray(512 << 20)"], timeout=20)
        assert memory.exit_code != 0 and b"MemoryError" in memory.stderr
        spin = await box.run([sys.executable, "-c", "while True: pass"], timeout=20)
        assert not spin.timed_out and spin.exit_code == -24  # SIGXCPU


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
async def test_default_memory_limit_does_not_break_node(box: LocalSandbox):
    result = await box.run(["node", "-e", "console.log(Buffer.alloc(64 << 20).length)"],
                           timeout=30)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == str(64 << 20).encode()


# -- files -----------------------------------------------------------------------------------

async def test_copy_in_and_out(tmp_path: Path, box: LocalSandbox):
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "a.txt").write_text("alpha")
    (source / "top.txt").write_text("top")
    await box.copy_in(source, "project")
    await box.copy_in(source / "top.txt", str(box.home / "notes" / "top.txt"))
    assert (box.workdir / "project" / "pkg" / "a.txt").read_text() == "alpha"
    assert (box.home / "notes" / "top.txt").read_text() == "top"
    await box.run("echo changed > project/pkg/a.txt", timeout=10)
    await box.copy_out("project", tmp_path / "out")
    assert (tmp_path / "out" / "pkg" / "a.txt").read_text() == "changed\n"
    await box.copy_out(str(box.workdir / "project" / "top.txt"), tmp_path / "top.txt")
    assert (tmp_path / "top.txt").read_text() == "top"


async def test_copies_stay_inside_the_sandbox(tmp_path: Path, box: LocalSandbox):
    (tmp_path / "f").write_text("x")
    for dest in ("/etc/evil", "../../outside", str(tmp_path / "elsewhere")):
        with pytest.raises(SandboxError, match="outside the sandbox"):
            await box.copy_in(tmp_path / "f", dest)
    with pytest.raises(SandboxError, match="outside the sandbox"):
        await box.copy_out("/etc/passwd", tmp_path / "passwd")
    # a link the agent made to a host file comes out as a link, not as the file
    await box.run("ln -s /etc/passwd leak", timeout=10)
    await box.copy_out("leak", tmp_path / "leak")
    assert (tmp_path / "leak").is_symlink()


async def test_close_removes_everything(tmp_path: Path):
    box = await LocalSandbox.create(tmp_path, "gone")
    await box.run("mkdir -p ro/deep && touch ro/deep/f && chmod 500 ro/deep ro", timeout=10)
    private = box.host.private
    await box.close()
    await box.close()  # idempotent
    assert not box.directory.exists() and not private.exists()
    with pytest.raises(SandboxError, match="closed"):
        await box.run("true", timeout=5)


async def test_create_refuses_reuse_and_bad_names(tmp_path: Path):
    async with await LocalSandbox.create(tmp_path, "same"):
        with pytest.raises(SandboxError, match="already exists"):
            await LocalSandbox.create(tmp_path, "same")
    for bad in ("../up", "a/b", "", ".hidden"):
        with pytest.raises(ValueError, match="sandbox name"):
            await LocalSandbox.create(tmp_path, bad)


# -- network isolation -----------------------------------------------------------------------

async def _echo_server() -> tuple[asyncio.AbstractServer, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"echo:" + await reader.readline())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


CONNECT = """
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
    s.sendall(b"ping\\n")
    print(s.makefile("rb").readline().decode().strip())
except OSError as error:
    print(type(error).__name__, error.errno)
"""


async def connect(box: LocalSandbox, host: str, port: int) -> str:
    result = await box.run([sys.executable, "-c", CONNECT, host, str(port)], timeout=20)
    return result.stdout.decode().strip()


async def test_unavailable_isolation_is_reported(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(sandbox_module, "_isolation_problem", lambda: "no namespaces here")
    with pytest.raises(NetworkIsolationUnavailable, match="no namespaces here"):
        await LocalSandbox.create(tmp_path, "n", network="none")
    assert not (tmp_path / "n").exists()


async def test_host_network_reaches_loopback(box: LocalSandbox):
    server, port = await _echo_server()
    async with server:
        assert await connect(box, "127.0.0.1", port) == "echo:ping"


@needs_netns
async def test_network_none_reaches_nothing(tmp_path: Path):
    server, port = await _echo_server()
    async with server, await LocalSandbox.create(tmp_path, "none", network="none") as box:
        assert await connect(box, "127.0.0.1", port) == "ConnectionRefusedError 111"
        assert await connect(box, "192.0.2.1", 80) == "OSError 101"  # network unreachable


@needs_netns
async def test_loopback_proxy_reaches_only_the_proxy(tmp_path: Path):
    proxy, proxy_port = await _echo_server()
    other, other_port = await _echo_server()
    async with proxy, other, await LocalSandbox.create(
            tmp_path, "proxied", network="loopback-proxy", proxy_ports=[proxy_port]) as box:
        assert await connect(box, "127.0.0.1", proxy_port) == "echo:ping"
        assert await connect(box, "localhost", proxy_port) == "echo:ping"
        assert await connect(box, "127.0.0.1", other_port) == "ConnectionRefusedError 111"
        assert await connect(box, "192.0.2.1", 80) == "OSError 101"
        # twice in one run: the relay serves many connections, then dies with the command
        many = await box.run(
            f"for i in 1 2 3; do {sys.executable} -c '{CONNECT}' 127.0.0.1 {proxy_port}; done",
            timeout=30)
        assert many.stdout.decode().split() == ["echo:ping"] * 3
    assert live_processes("netns_launcher") == []


async def test_hidden_host_paths_are_empty_but_own_files_stay(tmp_path):
    secret_task = tmp_path / "task"
    (secret_task / "tests").mkdir(parents=True)
    (secret_task / "tests" / "test_hidden.py").write_text("assert answer == 42\n")
    root = tmp_path / "sandboxes"
    other = await LocalSandbox.create(root, "other")
    (other.workdir / "their-work.txt").write_text("private")
    box = await LocalSandbox.create(root, "mine", hide=[secret_task, root])
    try:
        result = await box.run(
            f"echo mine > {box.home}/own.txt; cat {box.home}/own.txt; ls -A {secret_task}; "
            f"cat {other.workdir}/their-work.txt; ls {root}", timeout=30)
        out = result.stdout.decode()
        assert out.startswith("mine\n")
        assert "test_hidden" not in out and "tests" not in out and "private" not in out
        assert "other" not in out and "mine" in out  # only its own sandbox is left
        assert (box.home / "own.txt").read_text() == "mine\n"  # writes reach the host
        assert (secret_task / "tests" / "test_hidden.py").exists()  # the host is untouched
    finally:
        await box.close()
        await other.close()


async def test_confined_writes_stay_in_the_sandbox(tmp_path):
    """Even as root, the agent writes only below its own sandbox directory: /tmp is the
    sandbox's tmp/, every other host path is read-only."""
    outside = tmp_path / "outside"
    outside.mkdir()
    tag = f"hrl-escape-{os.getpid()}"
    box = await LocalSandbox.create(tmp_path / "sandboxes", "mine", confine=True)
    try:
        result = await box.run(
            f"echo a > /tmp/{tag}; echo b > /var/tmp/{tag}; echo c > /dev/shm/{tag}; "
            f"echo d > {outside}/{tag} || echo refused-outside; "
            f"echo e > /root/{tag} || echo refused-root; "
            f"echo f > {box.workdir}/own.txt; cat /tmp/{tag} > /dev/null && echo tmp-ok",
            timeout=30)
        out = result.stdout.decode()
        assert "refused-outside" in out and "refused-root" in out and "tmp-ok" in out, out
        for escaped in (Path("/tmp") / tag, Path("/var/tmp") / tag, Path("/dev/shm") / tag,
                        outside / tag, Path("/root") / tag):
            assert not escaped.exists(), f"{escaped} escaped the sandbox"
        assert (box.tmp / tag).read_text() == "c\n"  # /tmp, /var/tmp, /dev/shm: all tmp/
        assert (box.workdir / "own.txt").read_text() == "f\n"
    finally:
        await box.close()


async def test_confined_relative_writes_land_in_the_workdir(tmp_path):
    """A program that writes relative to the working directory it inherited (as the
    Continue CLI's shell does) writes into the workdir: the directory entered before the
    confinement's mounts is entered again through them, not left on a read-only mount."""
    box = await LocalSandbox.create(tmp_path / "sandboxes", "mine", confine=True)
    try:
        result = await box.run("echo g > relative.txt && pwd", timeout=30)
        assert result.exit_code == 0, result.stderr.decode()
        assert (box.workdir / "relative.txt").read_text() == "g\n"
    finally:
        await box.close()


@pytest.mark.skipif(not LocalSandbox.network_isolation_available(),
                    reason="network namespaces are not available here")
async def test_confined_sandbox_still_reaches_the_proxy(tmp_path):
    server, port = await _echo_server()
    box = await LocalSandbox.create(tmp_path, "box", network="loopback-proxy",
                                    proxy_ports=[port], confine=True)
    try:
        assert await connect(box, "127.0.0.1", port) == "echo:ping"
    finally:
        await box.close()
        server.close()
