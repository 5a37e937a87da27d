"""What every sandbox backend is and shares: the `Sandbox` protocol its sandboxes satisfy,
the result of a command, the errors, and the host side each backend keeps by composition
(`HostDirectory`: the sandbox directory, the command environment with its marker, the
owners entry and the Unix-socket relays to the capture proxy). No backend inherits
another's implementation; what two share lives here as small parts and functions.

The host directory of a sandbox:

    <root>/<name>/work    the agent's working directory (`workdir`)
    <root>/<name>/home    HOME
    <root>/<name>/tmp     TMPDIR
    <root>/<name>/...     tests/, logs/ and solution/, made by the verifier (tasks/task.py)

Commands see only a minimal environment (PATH, HOME, LANG, TMPDIR and what the caller
passes explicitly), so host secrets and proxy settings never reach them.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import resource
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from harnessrl.harnesses.base import DEFAULT_TOOLS_DIR
from harnessrl.rollout.sandbox import owners

Network = Literal["host", "none", "loopback-proxy"]
BuildNetwork = Literal["none", "host"]  # the network of a docker backend's `docker build`

OUTPUT_CAP = 16 << 20  # bytes of each output stream returned; the rest is dropped
# A clock of the seconds the engine was withheld from every rollout so far (the capture
# proxy's weight gate: `WeightGate.paused_seconds`), which a command's timeout leaves out.
Paused = Callable[[], float]

# Never passed into a sandbox, even when a caller names them: they would route traffic
# around the isolation, and the capture proxy is reached by its base URL instead.
_PROXY_VARIABLE = re.compile(r"(?i)^(https?|all|no|ftp|socks)_proxy$")


async def finished_within(task: asyncio.Future, timeout: float, paused: Paused | None) -> bool:
    """Wait for `task` up to `timeout` seconds, the deadline moved on by every second
    `paused` advances meanwhile; whether it finished. An agent waiting on a model call the
    proxy holds for the trainer (a weight swap, an optimizer step on the same machine) is
    not out of time for it: killed there, a rollout would fail or score for the trainer's
    time, not the agent's."""
    started, before = time.monotonic(), paused() if paused else 0.0
    while True:
        extra = paused() - before if paused else 0.0
        left = started + timeout + extra - time.monotonic()
        if left <= 0:
            return task.done()
        await asyncio.wait({task}, timeout=left)
        if task.done():
            return True


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
                  timeout: float, cwd: Path | None = None,
                  paused: Paused | None = None) -> ExecResult:
        """Run `command`, killed after `timeout` seconds not counting those `paused`
        advanced meanwhile (`finished_within`)."""
        ...

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


@dataclass(frozen=True, kw_only=True)
class BackendOptions:
    """What a caller asks of a sandbox backend when it makes one (registry.py); each
    backend reads the fields that apply to it and leaves the others'."""

    tools: Path = DEFAULT_TOOLS_DIR  # the harness prefixes: shown (local), mounted (docker)
    # local: commands' rlimits; their network; `hide_host` shows them an empty directory
    # where the sandboxes' root, the bundled tasks and the task's source are, and keeps
    # their writes inside the sandbox (as `confine` alone does); both need root.
    limits: Limits = Limits()
    network: Network = "host"
    hide_host: bool = False
    confine: bool = False
    # docker: one image for every task (None: each task's own), how many containers may
    # be starting at once, the network of `docker build`, the run the containers belong to.
    image: str | None = None
    starts: int = 2
    build_network: BuildNetwork = "none"
    run_label: str = ""


DEFAULT_LIMITS = Limits()
DEFAULT_OPTIONS = BackendOptions()


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


def check_name(name: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ValueError(f"sandbox name {name!r}: use letters, digits, '.', '_', '-'")


class HostDirectory:
    """A sandbox's host side, whatever runs its commands: `<root>/<name>` with work/, home/
    and tmp/, a private directory outside it (command output, relay sockets), the marker
    token every command carries (owners.py finds escaped processes by it), and the relays
    that carry the capture proxy's ports into the sandbox through Unix sockets."""

    def __init__(self, directory: Path, env: Mapping[str, str]) -> None:
        self.directory = directory
        self.token = secrets.token_hex(12)
        self.env = dict(env) | {owners.MARKER: self.token}
        # Unix socket paths are limited to ~108 bytes, so not under a possibly deep root.
        self.private = Path(tempfile.mkdtemp(prefix="hrl-sbx-"))
        self.relay_dir = self.private / "relay"
        self.relays: list[tuple[int, str]] = []  # (host port, its socket)
        self._servers: list[asyncio.AbstractServer] = []
        self.closed = False

    @classmethod
    def make(cls, root: Path, name: str, allowed_env: Mapping[str, str]) -> HostDirectory:
        """A fresh `root/name` (which must not exist yet), registered with its owner.
        `allowed_env` is added to the minimal environment of every command."""
        check_name(name)
        check_env(allowed_env)
        directory = Path(root).resolve() / name
        try:
            directory.mkdir(parents=True)
        except FileExistsError:
            raise SandboxError(f"sandbox directory {directory} already exists") from None
        for sub in ("work", "home", "tmp"):
            (directory / sub).mkdir()
        host = cls(directory, minimal_env(directory / "home", directory / "tmp")
                   | dict(allowed_env))
        owners.register(host.token, directory, host.private)
        return host

    @property
    def home(self) -> Path:
        return self.directory / "home"

    @property
    def tmp(self) -> Path:
        return self.directory / "tmp"

    def inside(self, path: str, workdir: Path) -> Path:
        """`path` (relative to `workdir`, or absolute) resolved, if it lies in the sandbox."""
        resolved = (workdir / path).resolve()  # an absolute `path` replaces workdir
        if not resolved.is_relative_to(self.directory):
            raise SandboxError(f"{path!r} is outside the sandbox {self.directory}")
        return resolved

    async def start_relays(self, ports: Sequence[int]) -> None:
        """A Unix socket per host loopback port; each connection to it is forwarded."""
        try:
            self.relay_dir.mkdir(exist_ok=True)
            for port in ports:
                path = str(self.relay_dir / f"{port}.sock")
                handler = functools.partial(_forward, port=port)
                self._servers.append(await asyncio.start_unix_server(handler, path=path))
                self.relays.append((port, path))
        except OSError as error:
            raise SandboxError(f"cannot start the proxy relay: {error}") from error

    def relay_args(self) -> list[str]:
        """The relay launcher's `--relay PORT=SOCKET` arguments."""
        return [a for port, path in self.relays for a in ("--relay", f"{port}={path}")]

    async def close(self) -> None:
        """Kill anything still marked, stop the relays, remove the directories."""
        if self.closed:
            return
        self.closed = True
        await asyncio.to_thread(owners.kill_marked, self.token)
        for server in self._servers:
            server.close()
        for directory in (self.private, self.directory):
            await asyncio.to_thread(owners.remove_tree, directory)
        owners.unregister(self.token)


def text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


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
