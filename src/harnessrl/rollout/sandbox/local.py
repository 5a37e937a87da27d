"""The `local` sandbox backend: commands run on this machine, in a directory of their own
(the host directory of base.py).

Each command gets rlimits and a process group of its own; when it ends or times out the
whole group is killed, and anything that left the group (setsid) is found by a marker
variable and killed too. Nothing started in the sandbox outlives the command that started
it, nor the runner: each command's first process (reaper_launcher.py) watches the runner
and, if it dies (even by SIGKILL), kills the command's group and marked processes. Every
sandbox is registered with its owner (owners.py) until it closes, so what a dead runner
left is swept at the next runner start or by `harnessrl sandboxes --remove`.

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
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from harnessrl.rollout.sandbox.base import (
    DEFAULT_LIMITS,
    OUTPUT_CAP,
    BackendOptions,
    ExecResult,
    HostDirectory,
    Limits,
    Network,
    NetworkIsolationUnavailable,
    Paused,
    SandboxError,
    check_env,
    check_name,
    copy_tree,
    finished_within,
    text,
)
from harnessrl.rollout.sandbox.owners import kill_marked
from harnessrl.rollout.tasks.task import BUNDLED, Task

_LAUNCHER = Path(__file__).with_name("netns_launcher.py")
_CONFINE_LAUNCHER = Path(__file__).with_name("confine_launcher.py")
_PROBE = Path(__file__).with_name("sandbox_probe.py")
_REAPER = Path(__file__).with_name("reaper_launcher.py")


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


def confinement_available() -> bool:
    """Whether `hide` and `confine` work here (a private mount namespace)."""
    return _mount_problem() is None


class LocalSandbox:
    def __init__(self, host: HostDirectory, *, limits: Limits, network: Network,
                 kill_grace: float, hide: Sequence[Path] = (), show: Sequence[Path] = (),
                 confined: bool = False) -> None:
        self.host = host
        self.directory = host.directory
        self.workdir = host.directory / "work"
        self.task_root = host.directory
        self.image_workdir = False
        self.home = host.home
        self.tmp = host.tmp
        self.limits = limits
        self.network = network
        self.kill_grace = kill_grace
        self.hide = tuple(Path(p).resolve() for p in hide)
        self.show = tuple(Path(p) for p in show)
        self.confined = confined
        self._runs = itertools.count()

    @property
    def token(self) -> str:
        return self.host.token

    @property
    def closed(self) -> bool:
        return self.host.closed

    @classmethod
    async def create(cls, root: Path, name: str, *, allowed_env: Mapping[str, str] = {},
                     limits: Limits = DEFAULT_LIMITS, network: Network = "host",
                     proxy_ports: Sequence[int] = (), kill_grace: float = 2.0,
                     hide: Sequence[Path] = (), show: Sequence[Path] = (),
                     confine: bool = False) -> LocalSandbox:
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
        check_name(name)
        if network not in ("host", "none", "loopback-proxy"):
            raise ValueError(f"network must be host, none or loopback-proxy, not {network!r}")
        if network != "host" and (problem := _isolation_problem()) is not None:
            raise NetworkIsolationUnavailable(
                f"network={network!r} needs a network namespace: {problem}")
        check_env(allowed_env)
        if (hide or confine) and (problem := _mount_problem()) is not None:
            raise SandboxError(f"cannot confine the agent to its sandbox: {problem}")
        sandbox = cls(HostDirectory.make(root, name, allowed_env), limits=limits,
                      network=network, kill_grace=kill_grace, hide=hide, show=show,
                      confined=bool(hide) or confine)
        try:
            if network == "loopback-proxy":
                await sandbox.host.start_relays(proxy_ports)
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
        return confinement_available()

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
            argv = [sys.executable, "-I", str(_LAUNCHER), *self.host.relay_args(), "--",
                    *argv]
            namespaces.append("--net")
        if self.confined:
            hidden = [a for path in self.hide for a in ("--hide", str(path))]
            reveal = ["--reveal", str(self.host.relay_dir)] if self.host.relays else []
            shown = [a for path in self._needed(env) for a in ("--show", path)]
            argv = [sys.executable, "-I", str(_CONFINE_LAUNCHER), "--keep", str(self.directory),
                    "--tmp", str(self.tmp), *reveal, *shown, *hidden, "--", *argv]
            namespaces.append("--mount")
        argv = ["unshare", *namespaces, "--", *argv] if namespaces else argv
        return [sys.executable, "-I", "-S", str(_REAPER), "--owner", str(os.getpid()), "--token",
                self.token, "--", *argv]

    async def run(self, command: str | list[str], *, env: Mapping[str, str] | None = None,
                  timeout: float, cwd: Path | None = None,
                  paused: Paused | None = None) -> ExecResult:
        if self.closed:
            raise SandboxError(f"sandbox {self.directory} is closed")
        check_env(env or {})
        started = time.monotonic()
        # Output goes to files, not pipes: a background process that inherits a pipe would
        # keep it open (and asyncio's wait() waiting) long after the command has exited.
        n = next(self._runs)
        out_path, err_path = self.host.private / f"{n}.out", self.host.private / f"{n}.err"
        full_env = self.host.env | dict(env or {})
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self._argv(command, full_env), stdin=subprocess.DEVNULL, stdout=out,
                    stderr=err, cwd=self._inside(str(cwd or self.workdir)),
                    env=full_env, start_new_session=True, preexec_fn=self.limits.apply)
            except OSError as error:
                raise SandboxError(f"cannot start {command!r}: {error}") from error
        exited = asyncio.ensure_future(proc.wait())
        try:
            timed_out = not await finished_within(exited, timeout, paused)
            if timed_out:
                await self._terminate(proc)
        finally:
            await self._reap(proc)
            exited.cancel()  # done by now, or its process is gone with the reap
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
        ports = [str(port) for port, _path in self.host.relays]
        probe = [sys.executable, "-I", str(_PROBE), *ports, "--", *self._needed(self.host.env)]
        result = await self.run(probe, timeout=60)
        if result.exit_code != 0:
            detail = text(result.stdout + result.stderr).strip()[-2000:]
            how = "timed out" if result.timed_out else f"exit {result.exit_code}"
            raise SandboxError(f"the sandbox failed its self-check ({how}; confined="
                               f"{self.confined}, network={self.network}): {detail}")

    # -- files ---------------------------------------------------------------------------

    def _inside(self, path: str) -> Path:
        """`path` (relative to workdir, or absolute) resolved, if it lies in the sandbox."""
        return self.host.inside(path, self.workdir)

    async def copy_in(self, src: Path, dest: str) -> None:
        target = self._inside(dest)
        await asyncio.to_thread(copy_tree, Path(src), target)

    async def copy_out(self, src: str, dest: Path) -> None:
        # Symlinks are copied as links, never followed: a link the agent made to a host
        # file must not pull that file out.
        source = self.workdir / src
        await asyncio.to_thread(copy_tree, self._inside(str(source.parent)) / source.name,
                                Path(dest))

    async def close(self) -> None:
        """Kill anything still running and remove the sandbox's directories."""
        await self.host.close()

    async def __aenter__(self) -> LocalSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class LocalBackend:
    """The `local` backend: a `LocalSandbox` per call, as `options` ask (nothing to drain:
    a local sandbox is gone when it closes)."""

    def __init__(self, options: BackendOptions) -> None:
        self.options = options

    @classmethod
    def of(cls, options: BackendOptions) -> LocalBackend:
        return cls(options)

    async def sandbox(self, root: Path, name: str, task: Task | None = None,
                      proxy_ports: Sequence[int] = ()) -> LocalSandbox:
        """With `hide_host`, the commands see empty directories where the other sandboxes
        under `root`, the bundled tasks and the task's source (its tests and solution) are;
        the harness prefixes (`tools`) stay visible."""
        options = self.options
        hide = ([Path(root), BUNDLED, *([task.source] if task and task.source else [])]
                if options.hide_host else [])
        return await LocalSandbox.create(root, name, limits=options.limits,
                                         network=options.network, proxy_ports=proxy_ports,
                                         hide=hide, show=[options.tools] if hide else [],
                                         confine=options.confine)

    async def drain(self) -> None:
        return None

    def problem(self) -> str | None:
        options = self.options
        if options.network != "host" and (problem := _isolation_problem()) is not None:
            return f"network={options.network!r} needs a network namespace: {problem}"
        if options.hide_host or options.confine:
            return _mount_problem()
        return None


def _take(path: Path) -> bytes:
    with open(path, "rb") as handle:
        data = handle.read(OUTPUT_CAP)
    path.unlink()
    return data


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
