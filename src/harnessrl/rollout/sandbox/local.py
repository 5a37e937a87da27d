"""Sandboxes: where a harness and a task's verifier run, behind one small interface.

`LocalSandbox` runs commands on this machine in a directory of their own:

    <root>/<name>/work    the agent's working directory (`workdir`)
    <root>/<name>/home    HOME
    <root>/<name>/tmp     TMPDIR
    <root>/<name>/...     tests/, logs/ and solution/, made by the verifier (see tasks/task.py)

Commands see only a minimal environment (PATH, HOME, LANG, TMPDIR and what the caller
passes explicitly), so host secrets and proxy settings never reach them. Each command gets
rlimits and a process group of its own; when it ends or times out the whole group is
killed, and anything that left the group (setsid) is found by a marker variable and killed
too. Nothing started in the sandbox outlives the command that started it, nor the runner:
each command's first process (reaper_launcher.py) watches the runner and, if it dies (even
by SIGKILL), kills the command's group and marked processes. Every sandbox is registered
with its owner (owners.py) until it closes, so what a dead runner left is swept at the
next runner start or by `harnessrl sandboxes --remove`.

Network isolation (`network="none"` or `"loopback-proxy"`) runs each command in a new
network namespace (`unshare --net`, needs root or user namespaces): only loopback exists;
with "loopback-proxy" the listed host ports (the capture proxy) are relayed into the
namespace at the same 127.0.0.1 port through a Unix socket, so the agent reaches the proxy
and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, Self

from harnessrl.rollout.sandbox import owners

# Re-exported: the sandboxes' callers name them from here.
from harnessrl.rollout.sandbox.owners import MARKER as MARKER
from harnessrl.rollout.sandbox.owners import kill_marked as kill_marked

Network = Literal["host", "none", "loopback-proxy"]

OUTPUT_CAP = 16 << 20  # bytes of each output stream returned; the rest is dropped
_LAUNCHER = Path(__file__).with_name("netns_launcher.py")
_CONFINE_LAUNCHER = Path(__file__).with_name("confine_launcher.py")
_PROBE = Path(__file__).with_name("sandbox_probe.py")
_REAPER = Path(__file__).with_name("reaper_launcher.py")

# Never passed into a sandbox, even when a caller names them: they would route traffic
# around the isolation, and the capture proxy is reached by its base URL instead.
_PROXY_VARIABLE = re.compile(r"(?i)^(https?|all|no|ftp|socks)_proxy$")


class SandboxError(RuntimeError):
    """The sandbox itself failed (an infrastructure failure, not an agent result)."""


class NetworkIsolationUnavailable(SandboxError):
    pass


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None  # None when the command was killed at its timeout
    stdout: bytes
    stderr: bytes
    timed_out: bool
    seconds: float


class Sandbox(Protocol):
    workdir: Path
    home: Path
    # Harbor's "/" for the task's scripts: tests/, logs/verifier and solution/ under it.
    task_root: Path
    # True when the workdir and its files are an image's as built (nothing is copied in).
    image_workdir: bool

    async def run(self, command: str | list[str], *, env: Mapping[str, str] | None = None,
                  timeout: float, cwd: Path | None = None) -> ExecResult: ...

    async def copy_in(self, src: Path, dest: str) -> None:
        """Copy a host file or directory to `dest`: relative to workdir, or an absolute
        path inside the sandbox."""

    async def copy_out(self, src: str, dest: Path) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class Limits:
    """Per-process rlimits. Memory is RLIMIT_DATA, not RLIMIT_AS: node and Go reserve large
    PROT_NONE address ranges at start and die under an address-space cap, while a data cap
    counts only writable memory actually mapped."""

    cpu_seconds: int | None = 900
    memory_bytes: int | None = 4 << 30
    open_files: int | None = 4096
    file_size_bytes: int | None = 1 << 30

    def apply(self) -> None:  # runs in the child between fork and exec
        # CPU: the hard limit a second later, so the process first gets SIGXCPU (which it
        # may report) rather than an immediate SIGKILL.
        for limit, value, slack in ((resource.RLIMIT_CPU, self.cpu_seconds, 1),
                                    (resource.RLIMIT_DATA, self.memory_bytes, 0),
                                    (resource.RLIMIT_NOFILE, self.open_files, 0),
                                    (resource.RLIMIT_FSIZE, self.file_size_bytes, 0)):
            if value is not None:
                resource.setrlimit(limit, (value, value + slack))


@functools.cache
def _isolation_problem() -> str | None:
    """Why `unshare --net` cannot be used here, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if shutil.which("unshare") is None:
        return "the `unshare` program (util-linux) is not installed"
    try:
        done = subprocess.run(["unshare", "--net", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"`unshare --net true` failed: {error}"
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip()
        return (f"`unshare --net` is not permitted ({reason}); run as root or enable "
                "unprivileged user namespaces")
    return None


@functools.cache
def _mount_problem() -> str | None:
    """Why a private mount namespace cannot be made here, or None when it can."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "the `unshare` and `mount` programs (util-linux) are needed"
    done = subprocess.run(["unshare", "--mount", "--", "mount", "-t", "tmpfs", "probe",
                           tempfile.gettempdir()], capture_output=True, timeout=10)
    if done.returncode != 0:
        return (f"mounting in a private mount namespace failed "
                f"({done.stderr.decode(errors='replace').strip()}); run as root")
    return None


def minimal_env(home: Path, tmp: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TMPDIR": str(tmp),
    }


def check_env(env: Mapping[str, str]) -> None:
    bad = sorted(name for name in env if _PROXY_VARIABLE.match(name))
    if bad:
        raise ValueError(f"proxy variables are never passed into a sandbox: {', '.join(bad)}")


class LocalSandbox:
    def __init__(self, directory: Path, *, env: dict[str, str], limits: Limits,
                 network: Network, kill_grace: float) -> None:
        self.directory = directory
        self.workdir = directory / "work"
        self.task_root = directory
        self.image_workdir = False
        self.home = directory / "home"
        self.tmp = directory / "tmp"
        self.limits = limits
        self.network = network
        self.kill_grace = kill_grace
        self.token = secrets.token_hex(12)
        self._env = env | {MARKER: self.token}
        self._relays: list[tuple[int, str]] = []
        self._servers: list[asyncio.AbstractServer] = []
        self._runs = itertools.count()
        # Host-side files outside the sandbox: command output and the relay sockets (Unix
        # socket paths are limited to ~108 bytes, so not under a possibly deep root).
        self._private = Path(tempfile.mkdtemp(prefix="hrl-sbx-"))
        self._relay_dir = self._private / "relay"
        self.closed = False
        self.hide: tuple[Path, ...] = ()
        self.show: tuple[Path, ...] = ()
        self.confined = False

    @classmethod
    async def create(cls, root: Path, name: str, *, allowed_env: Mapping[str, str] = {},
                     limits: Limits = Limits(), network: Network = "host",
                     proxy_ports: Sequence[int] = (), kill_grace: float = 2.0,
                     hide: Sequence[Path] = (), show: Sequence[Path] = (),
                     confine: bool = False) -> Self:
        """A fresh sandbox at `root/name` (which must not exist yet). `allowed_env` is added
        to the minimal environment of every command; `proxy_ports` are the host loopback
        ports reachable with network="loopback-proxy". `hide` are host directories the
        commands see empty (the task's tests and solution, other rollouts' sandboxes); the
        sandbox's own directory stays visible even when it lies below one of them.
        `confine` (implied by `hide`) makes the rest of the host filesystem read-only to
        the commands and shows them the sandbox's tmp/ as /tmp, so nothing they write
        escapes the sandbox directory. What the commands need stays visible (read-only)
        even where it lies under /tmp: the interpreter and its import path, the launchers,
        the directories on their PATH, and `show` (e.g. the harness prefix).

        A sandbox with a launch chain (confinement, a network namespace) proves it at
        creation by running a trivial command through it; a failure is a `SandboxError`
        that names what is missing."""
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise ValueError(f"sandbox name {name!r}: use letters, digits, '.', '_', '-'")
        if network not in ("host", "none", "loopback-proxy"):
            raise ValueError(f"network must be host, none or loopback-proxy, not {network!r}")
        if network != "host" and (problem := _isolation_problem()) is not None:
            raise NetworkIsolationUnavailable(
                f"network={network!r} needs a network namespace: {problem}")
        check_env(allowed_env)
        directory = Path(root).resolve() / name
        try:
            directory.mkdir(parents=True)
        except FileExistsError:
            raise SandboxError(f"sandbox directory {directory} already exists") from None
        for sub in ("work", "home", "tmp"):
            (directory / sub).mkdir()
        env = minimal_env(directory / "home", directory / "tmp") | dict(allowed_env)
        if (hide or confine) and (problem := _mount_problem()) is not None:
            raise SandboxError(f"cannot confine the agent to its sandbox: {problem}")
        sandbox = cls(directory, env=env, limits=limits, network=network,
                      kill_grace=kill_grace)
        sandbox.hide = tuple(Path(p).resolve() for p in hide)
        sandbox.show = tuple(Path(p) for p in show)
        sandbox.confined = bool(hide) or confine
        owners.register(sandbox.token, directory, sandbox._private)
        try:
            if network == "loopback-proxy":
                try:
                    await sandbox._start_relays(proxy_ports)
                except OSError as error:
                    raise SandboxError(f"cannot start the proxy relay: {error}") from error
            if sandbox.confined or network != "host":
                await sandbox._self_check()
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    @staticmethod
    def network_isolation_available() -> bool:
        return _isolation_problem() is None

    @staticmethod
    def confinement_available() -> bool:
        """Whether `hide` and `confine` work here (a private mount namespace)."""
        return _mount_problem() is None

    @staticmethod
    def network_isolation_problem() -> str | None:
        """Why network isolation is unavailable here, or None."""
        return _isolation_problem()

    # -- commands ------------------------------------------------------------------------

    def _needed(self, env: Mapping[str, str]) -> list[str]:
        """Host paths the commands need to see: the interpreter that runs the launchers
        (and the verifiers, as $PYTHON) with its import path, the launchers, the PATH
        they are given, and `show`; those that exist here, each as given and resolved (a
        venv's python is a link)."""
        paths = [sys.prefix, sys.exec_prefix, sys.base_prefix,
                 os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(
                     sys.executable)), str(_LAUNCHER.parent), *sys.path,
                 *env.get("PATH", "").split(os.pathsep), *map(str, self.show)]
        present = [p for p in paths if os.path.isabs(p) and os.path.exists(p)]
        return sorted({q for p in present for q in (p, os.path.realpath(p))})

    def _argv(self, command: str | list[str], env: Mapping[str, str]) -> list[str]:
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        namespaces = []
        if self.network != "host":
            relays = [a for port, path in self._relays for a in ("--relay", f"{port}={path}")]
            argv = [sys.executable, "-I", str(_LAUNCHER), *relays, "--", *argv]
            namespaces.append("--net")
        if self.confined:
            hidden = [a for path in self.hide for a in ("--hide", str(path))]
            reveal = ["--reveal", str(self._relay_dir)] if self._relays else []
            shown = [a for path in self._needed(env) for a in ("--show", path)]
            argv = [sys.executable, "-I", str(_CONFINE_LAUNCHER), "--keep", str(self.directory),
                    "--tmp", str(self.tmp), *reveal, *shown, *hidden, "--", *argv]
            namespaces.append("--mount")
        argv = ["unshare", *namespaces, "--", *argv] if namespaces else argv
        return [sys.executable, "-I", "-S", str(_REAPER), "--owner", str(os.getpid()), "--token",
                self.token, "--", *argv]

    async def run(self, command: str | list[str], *, env: Mapping[str, str] | None = None,
                  timeout: float, cwd: Path | None = None) -> ExecResult:
        if self.closed:
            raise SandboxError(f"sandbox {self.directory} is closed")
        check_env(env or {})
        started = time.monotonic()
        # Output goes to files, not pipes: a background process that inherits a pipe would
        # keep it open (and asyncio's wait() waiting) long after the command has exited.
        n = next(self._runs)
        out_path, err_path = self._private / f"{n}.out", self._private / f"{n}.err"
        full_env = self._env | dict(env or {})
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self._argv(command, full_env), stdin=subprocess.DEVNULL, stdout=out,
                    stderr=err, cwd=self._inside(str(cwd or self.workdir)),
                    env=full_env, start_new_session=True, preexec_fn=self.limits.apply)
            except OSError as error:
                raise SandboxError(f"cannot start {command!r}: {error}") from error
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            timed_out = True
            await self._terminate(proc)
        finally:
            await self._reap(proc)
        return ExecResult(exit_code=None if timed_out else proc.returncode,
                          stdout=_take(out_path), stderr=_take(err_path), timed_out=timed_out,
                          seconds=time.monotonic() - started)

    async def _terminate(self, proc: asyncio.subprocess.Process) -> None:
        """SIGTERM the group, give it `kill_grace` seconds, then (in _reap) SIGKILL."""
        _killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), self.kill_grace)

    async def _reap(self, proc: asyncio.subprocess.Process) -> None:
        # Also on cancellation: whatever the command left behind (background jobs, the
        # relay, daemons that left the group) dies with it.
        _killpg(proc.pid, signal.SIGKILL)
        await asyncio.to_thread(kill_marked, self.token)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await asyncio.shield(proc.wait())

    async def _self_check(self) -> None:
        """Run the probe through the whole launch chain: every needed path visible, every
        relayed port answering. Before any agent or verifier depends on it."""
        ports = [str(port) for port, _path in self._relays]
        probe = [sys.executable, "-I", str(_PROBE), *ports, "--", *self._needed(self._env)]
        result = await self.run(probe, timeout=60)
        if result.exit_code != 0:
            detail = _text(result.stdout + result.stderr).strip()[-2000:]
            how = "timed out" if result.timed_out else f"exit {result.exit_code}"
            raise SandboxError(f"the sandbox failed its self-check ({how}; confined="
                               f"{self.confined}, network={self.network}): {detail}")

    # -- files ---------------------------------------------------------------------------

    def _inside(self, path: str) -> Path:
        """`path` (relative to workdir, or absolute) resolved, if it lies in the sandbox."""
        resolved = (self.workdir / path).resolve()  # an absolute `path` replaces workdir
        if not resolved.is_relative_to(self.directory):
            raise SandboxError(f"{path!r} is outside the sandbox {self.directory}")
        return resolved

    async def copy_in(self, src: Path, dest: str) -> None:
        target = self._inside(dest)
        await asyncio.to_thread(copy_tree, Path(src), target)

    async def copy_out(self, src: str, dest: Path) -> None:
        # Symlinks are copied as links, never followed: a link the agent made to a host
        # file must not pull that file out.
        source = self.workdir / src
        await asyncio.to_thread(copy_tree, self._inside(str(source.parent)) / source.name,
                                Path(dest))

    # -- network relays ------------------------------------------------------------------

    async def _start_relays(self, ports: Sequence[int]) -> None:
        self._relay_dir.mkdir(exist_ok=True)
        for port in ports:
            path = str(self._relay_dir / f"{port}.sock")
            handler = functools.partial(_forward, port=port)
            self._servers.append(await asyncio.start_unix_server(handler, path=path))
            self._relays.append((port, path))

    async def close(self) -> None:
        """Kill anything still running and remove the sandbox's directories."""
        if self.closed:
            return
        self.closed = True
        await asyncio.to_thread(kill_marked, self.token)
        for server in self._servers:
            server.close()
        for directory in (self._private, self.directory):
            await asyncio.to_thread(owners.remove_tree, directory)
        owners.unregister(self.token)

    async def __aenter__(self) -> LocalSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _take(path: Path) -> bytes:
    with open(path, "rb") as handle:
        data = handle.read(OUTPUT_CAP)
    path.unlink()
    return data


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def copy_tree(src: Path, dest: Path) -> None:
    """A file or a tree (links copied as links) to `dest`, merged into what is there."""
    if not src.exists() and not src.is_symlink():
        raise SandboxError(f"cannot copy {src}: no such file or directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dest, follow_symlinks=False)


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                   port: int) -> None:
    """One relayed connection: the sandbox's Unix socket to host 127.0.0.1:port."""
    try:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        writer.close()
        return
    try:
        await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
    finally:
        for end in (writer, up_writer):
            end.close()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()
