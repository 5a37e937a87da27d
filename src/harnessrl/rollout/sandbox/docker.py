"""The `docker` sandbox: a task's own image, built from its `environment/Dockerfile` or named
by its `[environment] docker_image` (docker_images.py says which image and how it is made).

It keeps the local sandbox's directory (home/, tmp/, and for the base image work/, tests/,
logs/) on the host and bind-mounts it into the container at the same path, so paths mean the
same inside and out. In the task's own image the agent, the oracle and the verifier work in
the image's WORKDIR on its files as built (nothing is mounted over it or copied into it), and
the verifier's /tests, /logs/verifier and the oracle's /solution are the container's own,
reached with `docker cp`: Harbor's container, as Harbor runs it. Our launcher, relay and
runtimes are mounted elsewhere (/opt/harnessrl, and the host paths of the runtimes, which
are absolute in their own files); a mount that would hide the WORKDIR or add to it fails the
start, saying which. Nothing else of the host is writable inside: a write outside the sandbox
directory lands in the container's own filesystem and is gone with it.

Network: always `--network none` (the daemon needs no bridge). The capture proxy is reached
through the local sandbox's Unix-socket relay: the relay directory is mounted in, and the
container's first process (netns_launcher.py, run by the mounted Python) listens on
127.0.0.1:<port> inside and hands every connection to the socket. The proxy is the only
address the agent can reach.

Runtimes: the harness prefixes, the Python runtimes they and the verifier use (this
interpreter, its venv, each harness venv's base Python) and Node are mounted read-only, so an
unmodified task image needs nothing installed. An image that cannot run them (another libc)
fails the start-up self-check, an infrastructure error that says so.

Hygiene: every container carries labels naming its owner process (pid and start time), and
is registered with it (owners.py); on SIGINT/SIGTERM (and at exit) the process removes each
container it started, a watcher process (reaper_launcher.py) removes them when the owner
dies without doing so (SIGKILL), and `sweep()` removes those whose owner is gone. Commands run with
`docker exec`; their deadline is kept on this side and, as in the local sandbox, every
process a command started is found by its marker variable (containers' processes are
visible in this host's /proc) and killed when it ends or times out.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import os
import posixpath
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Re-exported: the sandbox's callers name them from here.
from harnessrl.rollout.sandbox import owners
from harnessrl.rollout.sandbox.base import (
    OUTPUT_CAP,
    BackendOptions,
    BuildNetwork,
    ExecResult,
    HostDirectory,
    Paused,
    SandboxError,
    check_env,
    copy_tree,
    finished_within,
)
from harnessrl.rollout.sandbox.docker_images import BASE_IMAGE as BASE_IMAGE
from harnessrl.rollout.sandbox.docker_images import Images, docker
from harnessrl.rollout.sandbox.docker_images import docker_problem as docker_problem
from harnessrl.rollout.sandbox.owners import kill_marked
from harnessrl.rollout.tasks.task import BUNDLED, Task

LABEL = owners.LABEL  # "<pid>:<start time>" of the process that started the container
RUN_LABEL = "harnessrl.run"  # the run directory, for `docker ps -a --filter label=...`
OPT = "/opt/harnessrl"  # inside: the launcher, the probe and bin/node
RUNTIME_BIN = f"{OPT}/bin"
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_HERE = Path(__file__).parent
_FILES = {"netns_launcher.py": f"{OPT}/relay.py", "sandbox_probe.py": f"{OPT}/probe.py"}
_SYSTEM = ("/", "/usr", "/usr/local", "/bin", "/lib", "/opt")  # never mounted over an image


# -- owners, signals and the sweep ------------------------------------------------------------

_LIVE: set[str] = set()  # containers this process started and has not removed


def remove_now(names: Sequence[str]) -> None:
    """Remove containers synchronously (from a signal handler or at exit)."""
    if names:
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True, timeout=60)


def _on_signal(signum: int, _frame: object) -> None:
    remove_now(sorted(_LIVE))
    _LIVE.clear()
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_cleanup() -> None:
    """Once per process: remove our containers on SIGINT, SIGTERM and at exit, and start
    a watcher that removes them if this process dies without doing so (SIGKILL). A
    handler someone else installed is left alone (its owner decides how to stop)."""
    if getattr(_install_cleanup, "done", False):
        return
    _install_cleanup.done = True  # type: ignore[attr-defined]
    atexit.register(lambda: remove_now(sorted(_LIVE)))
    # In a session of its own: a signal to this process's group does not stop it before
    # it has cleaned up.
    subprocess.Popen([sys.executable, "-I", "-S", str(_HERE / "reaper_launcher.py"), "--owner",
                      str(os.getpid()), "--docker-label", f"{LABEL}={owners.owner()}"],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError):  # not the main thread
            if signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler):
                signal.signal(signum, _on_signal)


async def sweep() -> list[str]:
    """Remove the containers whose owner process is gone; the names of those removed."""
    dead = [name for name, label in (await _labelled()).items() if not owners.alive(label)]
    if not dead:
        return []
    # A dead owner's watcher may be removing the same containers: `rm -f` then fails for
    # those ("already in progress"), and they are still listed until the daemon is done.
    await docker("rm", "-f", *dead)
    deadline = time.monotonic() + 30
    while (left := set(dead) & set(await _labelled())) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return [name for name in dead if name not in left]


async def _labelled() -> dict[str, str]:
    """Every container with an owner label: its name and the owner."""
    listed = await docker("ps", "-a", "--filter", f"label={LABEL}", "--format",
                          f'{{{{.Names}}}} {{{{.Label "{LABEL}"}}}}')
    if listed.returncode != 0:
        raise SandboxError(f"docker ps failed: {listed.stdout.strip()[-500:]}")
    pairs = (line.partition(" ") for line in listed.stdout.splitlines())
    return {name: owner for name, _, owner in pairs}


# -- limits and runtimes ---------------------------------------------------------------------

@dataclass(frozen=True)
class ContainerLimits:
    cpus: float = 2.0
    memory_mb: int = 4096
    pids: int = 4096

    @classmethod
    def of(cls, task: Task) -> ContainerLimits:
        """Harbor's task.toml [environment] cpus and memory_mb (or memory = "2G")."""
        table = task.environment
        cpus, memory = table.get("cpus"), table.get("memory_mb")
        if isinstance(table.get("memory"), str) and table["memory"][:-1].isdigit():
            scale = {"G": 1024, "M": 1}.get(table["memory"][-1].upper())
            memory = int(table["memory"][:-1]) * scale if scale else memory
        return cls(cpus=float(cpus) if isinstance(cpus, int | float) and cpus > 0 else 2.0,
                   memory_mb=int(memory) if isinstance(memory, int) and memory > 0 else 4096)

    def args(self) -> list[str]:
        return ["--cpus", f"{self.cpus:g}", "--memory", f"{self.memory_mb}m",
                "--memory-swap", f"{self.memory_mb}m", "--pids-limit", str(self.pids)]


def _python_homes(tools: Path) -> list[Path]:
    """The prefixes of this interpreter and of every harness venv's base Python."""
    homes = {Path(sys.prefix), Path(sys.base_prefix),
             Path(os.path.realpath(sys.executable)).parent.parent}
    for cfg in tools.expanduser().glob("pypi/*/pyvenv.cfg"):
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home":
                homes.add(Path(os.path.realpath(value.strip())).parent)
    return sorted(h for h in homes if h.is_dir() and str(h) not in _SYSTEM)


def mount_targets(arguments: Sequence[str]) -> list[Path]:
    """Where in the container the `-v`/`--mount` arguments mount something."""
    targets = []
    for flag, value in itertools.pairwise(arguments):
        if flag == "-v":
            targets.append(Path(value.split(":")[1]))
        elif flag == "--mount":
            targets.append(Path(value.partition("destination=")[2].split(",")[0]))
    return targets


def workdir_clash(workdir: Path, mounted: Sequence[Path]) -> str | None:
    """Why our mounts would change what the image has in its WORKDIR, or None: a mount at
    or above it hides the image's files; one below it adds a directory the agent and the
    verifier would see (below "/" everything is, and adds nothing to a listing of it)."""
    for target in mounted:
        if workdir == target or workdir.is_relative_to(target):
            return f"{target} (mounted by the sandbox) would hide the image's WORKDIR {workdir}"
        if workdir != Path("/") and target.is_relative_to(workdir):
            return (f"{target} (mounted by the sandbox) lies inside the image's WORKDIR "
                    f"{workdir} and would add files there; run from another directory or "
                    "use another WORKDIR")
    return None


def runtime_mounts(tools: Path) -> list[str]:
    """`-v` arguments: tools, Python runtimes and Node read-only, each where the host has
    it (Node at /opt/harnessrl/bin/node, put first on PATH); the launcher and the probe."""
    paths = {Path(tools).expanduser().resolve(), *_python_homes(tools)}
    mounts = [a for p in sorted(paths) if p.exists() for a in ("-v", f"{p}:{p}:ro")]
    for name, inside in _FILES.items():
        mounts += ["-v", f"{_HERE / name}:{inside}:ro"]
    if (node := shutil.which("node")) is not None:
        mounts += ["-v", f"{os.path.realpath(node)}:{RUNTIME_BIN}/node:ro"]
    # A wheel install keeps the bundled tasks (with their solutions) in site-packages.
    bundled = BUNDLED
    if bundled.is_relative_to(sys.prefix) or bundled.is_relative_to(sys.base_prefix):
        mounts += ["--mount", f"type=tmpfs,destination={bundled}"]
    return mounts


def _path(given: str, image_first: bool) -> str:
    """Our Node first; in a task's own image, then the image's directories before the rest
    (a harness's venv bin), so the agent's `python3` and `pip` are the image's, with what
    its Dockerfile installed, as in Harbor; the harness itself starts by absolute path."""
    parts = given.split(":")
    if image_first:
        system = IMAGE_PATH.split(":")
        parts = [*system, *(p for p in parts if p not in system)]
    return ":".join([RUNTIME_BIN, *parts])


# -- the sandbox -----------------------------------------------------------------------------

class DockerSandbox:
    """A container with the sandbox's host directory mounted (`host`, the local sandbox's
    kind of directory, by composition): commands run with `docker exec`."""

    removals: set[asyncio.Future[None]] | None = None

    def __init__(self, host: HostDirectory, *, image: str, kill_grace: float,
                 workdir: str | None) -> None:
        self.host = host
        self.directory = host.directory
        self.home = host.home
        self.tmp = host.tmp
        self.kill_grace = kill_grace
        self.container = f"harnessrl-{host.directory.name[:80]}-{host.token[:8]}"
        self.image = image
        self.image_workdir = workdir is not None
        self.workdir = Path(workdir) if workdir is not None else host.directory / "work"
        self.task_root = Path("/") if workdir is not None else host.directory

    @property
    def token(self) -> str:
        return self.host.token

    @property
    def closed(self) -> bool:
        return self.host.closed

    @classmethod
    async def start(cls, root: Path, name: str, *, image: str, tools: Path,
                    proxy_ports: Sequence[int] = (), allowed_env: Mapping[str, str] = {},
                    limits: ContainerLimits = ContainerLimits(), run_label: str = "",
                    kill_grace: float = 2.0, workdir: str | None = None) -> DockerSandbox:
        """A running container of `image` with the sandbox directory mounted, the proxy
        ports relayed in, and the runtimes mounted; proved by a self-check. With `workdir`
        (the image's WORKDIR, for a task's own image) commands work there on the image's
        files, and the task's tests/, logs/ and solution/ go to the container's /tests,
        /logs and /solution, as in Harbor; without, in the mounted host workdir."""
        box = cls(HostDirectory.make(root, name, allowed_env), image=image,
                  kill_grace=kill_grace, workdir=workdir)
        try:
            await box._start_container(tools, proxy_ports, limits, run_label)
            await box._check()
        except BaseException:
            await box.close()
            raise
        return box

    async def _start_container(self, tools: Path, ports: Sequence[int],
                               limits: ContainerLimits, run_label: str) -> None:
        await self.host.start_relays(ports)
        python = os.path.realpath(sys.executable)
        mounts = ["-v", f"{self.directory}:{self.directory}",
                  "-v", f"{self.host.relay_dir}:{self.host.relay_dir}", *runtime_mounts(tools)]
        if self.image_workdir and (clash := workdir_clash(self.workdir,
                                                          mount_targets(mounts))):
            raise SandboxError(f"image {self.image!r}: {clash}")
        _install_cleanup()
        _LIVE.add(self.container)
        owners.register(self.token, self.directory, self.host.private, self.container)
        started = await docker(
            "run", "-d", "--name", self.container, "--label", f"{LABEL}={owners.owner()}",
            "--label", f"{RUN_LABEL}={run_label}", "--network", "none", "--init",
            "--security-opt", "no-new-privileges", *limits.args(), *mounts,
            "-w", str(self.workdir), "--entrypoint", python, self.image,
            "-I", _FILES["netns_launcher.py"], *self.host.relay_args(), "--", *self._probe())
        if started.returncode != 0:
            raise SandboxError(f"docker run {self.image} failed: {started.stdout.strip()[-800:]}")

    def _probe(self) -> list[str]:
        """The container's first command after the relay listens: the self-check, its
        report written to `ready`, then it waits, keeping the container up."""
        node = ["--node", f"{RUNTIME_BIN}/node"] if shutil.which("node") else []
        ports = [str(port) for port, _path in self.host.relays]
        return [os.path.realpath(sys.executable), "-I", _FILES["sandbox_probe.py"], *node,
                "--report", str(self.host.relay_dir / "ready"), *ports, "--",
                str(self.workdir)]

    async def _check(self) -> None:
        """The runtimes run in this image and the relayed proxy answers, or why not."""
        await self._relay_ready()
        report = self.host.relay_dir / "ready"
        detail = report.read_text().strip() if report.exists() else "no self-check report"
        if report.exists() and not detail:
            return
        state = await docker("inspect", "-f", "{{.State.Status}} exit {{.State.ExitCode}}",
                             self.container)
        logs = await docker("logs", "--tail", "20", self.container)
        raise SandboxError(
            f"image {self.image!r} cannot run the sandbox's runtimes (the mounted Python "
            f"{os.path.realpath(sys.executable)} and Node; another libc?) or reach the proxy: "
            f"container {state.stdout.strip()}; {detail[-1500:]} {logs.stdout.strip()[-800:]}")

    async def _relay_ready(self, wait: float = 30.0) -> None:
        """Until the first process wrote its self-check's report (`ready`), or it died."""
        deadline = time.monotonic() + wait
        ready, polls = self.host.relay_dir / "ready", 0
        while not ready.exists() and time.monotonic() < deadline:
            polls += 1
            if polls % 25 == 0:
                state = await docker("inspect", "-f", "{{.State.Running}}", self.container)
                if state.stdout.strip() != "true":
                    return  # the check that follows says why
            await asyncio.sleep(0.02)

    async def run(self, command: str | list[str], *, env: Mapping[str, str] | None = None,
                  timeout: float, cwd: Path | None = None,
                  paused: Paused | None = None) -> ExecResult:
        if self.closed:
            raise SandboxError(f"sandbox {self.directory} is closed")
        check_env(env or {})
        merged = {k: v for k, v in self.host.env.items() if k != "PATH"} | dict(env or {})
        # The image's own PATH (not the host's), Node first.
        merged["PATH"] = _path(merged.get("PATH") or IMAGE_PATH, self.image_workdir)
        argv = ["docker", "exec", "-w", str(self._inside(str(cwd or self.workdir)))]
        for key, value in merged.items():
            argv += ["-e", f"{key}={value}"]
        inner = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *argv, self.container, *inner, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
        talk = asyncio.ensure_future(proc.communicate())
        try:
            timed_out = not await finished_within(talk, timeout, paused)
            if timed_out:
                await self._stop_marked(talk)
            stdout, stderr = await talk
        finally:
            # Also on cancellation: nothing the command started outlives it.
            await asyncio.to_thread(kill_marked, self.token)
            if not talk.done():
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await asyncio.shield(talk)
        return ExecResult(exit_code=None if timed_out else proc.returncode,
                          stdout=stdout[:OUTPUT_CAP], stderr=stderr[:OUTPUT_CAP],
                          timed_out=timed_out, seconds=time.monotonic() - started)

    async def _stop_marked(self, talk: asyncio.Future) -> None:
        """TERM the command's processes (inside the container), `kill_grace` s, KILL."""
        await asyncio.to_thread(kill_marked, self.token, signal.SIGTERM)
        await asyncio.wait({talk}, timeout=self.kill_grace)
        await asyncio.to_thread(kill_marked, self.token)
        await asyncio.wait({talk}, timeout=10)

    # -- files: the mounted sandbox directory on the host, the rest with `docker cp` -------

    def _inside(self, path: str) -> Path:
        if not self.image_workdir:
            return self.host.inside(path, self.workdir)
        # A container path: normalised (not resolved: the host has no such tree).
        return Path(posixpath.normpath(posixpath.join(str(self.workdir), path)))

    def _mounted(self, path: Path) -> bool:
        return path.is_relative_to(self.directory)

    async def copy_in(self, src: Path, dest: str) -> None:
        target = self._inside(dest)
        if self._mounted(target):  # resolved on the host: a link cannot lead out
            target = self.host.inside(str(target), self.workdir)
            return await asyncio.to_thread(copy_tree, Path(src), target)
        src = Path(src)
        made = await self.run(["mkdir", "-p", str(target if src.is_dir() else target.parent)],
                              timeout=60)
        if made.exit_code != 0:
            raise SandboxError(f"cannot make {target} in the container: "
                               f"{(made.stdout + made.stderr).decode(errors='replace')}")
        # "src/." copies a directory's contents into the existing target.
        copied = await docker("cp", f"{src}/." if src.is_dir() else str(src),
                              f"{self.container}:{target}", timeout=600)
        if copied.returncode != 0:
            raise SandboxError(f"cannot copy {src} to {target} in the container: "
                               f"{copied.stdout.strip()[-500:]}")

    async def copy_out(self, src: str, dest: Path) -> None:
        source = self._inside(src)
        if self._mounted(source):
            source = self.host.inside(str(source.parent), self.workdir) / source.name
            return await asyncio.to_thread(copy_tree, source, Path(dest))
        # Through a fresh host directory: `docker cp` copies links as links (never follows
        # one the agent made), and puts a directory inside an existing destination.
        with tempfile.TemporaryDirectory(prefix="hrl-cp-") as staging:
            landed = Path(staging) / "out"
            copied = await docker("cp", f"{self.container}:{source}", str(landed),
                                  timeout=600)
            if copied.returncode != 0:
                raise SandboxError(f"cannot copy {source} out of the container: "
                                   f"{copied.stdout.strip()[-500:]}")
            await asyncio.to_thread(copy_tree, landed, Path(dest))

    async def close(self) -> None:
        """Kill what runs, remove the host directories and the container. With `removals`
        set (a runner's sandboxes), `docker rm` goes on in the background, into that set:
        the runner awaits it before it returns, and until then the container stays in
        _LIVE (removed on a signal or at exit)."""
        if self.container and not self.closed:
            if self.removals is None:
                await self._remove()
            else:
                removal = asyncio.ensure_future(self._remove())
                self.removals.add(removal)
                removal.add_done_callback(self.removals.discard)
        await self.host.close()

    async def _remove(self) -> None:
        await docker("rm", "-f", self.container, timeout=120)
        _LIVE.discard(self.container)


class DockerBackend:
    """The `docker` backend: one runner's docker side: task images, a cap on concurrent
    container starts (apart from the rollouts' concurrency), the start-up sweep of dead
    runners' containers, and the containers still being removed (`drain` before the runner
    returns)."""

    def __init__(self, *, image: str | None, tools: Path, starts: int = 2,
                 run_label: str = "", build_network: BuildNetwork = "none") -> None:
        self.images = Images(image, build_network)
        self.tools = tools
        self.run_label = run_label
        self._starts = asyncio.Semaphore(starts)
        self._swept = False
        self._removals: set[asyncio.Future[None]] = set()

    @classmethod
    def of(cls, options: BackendOptions) -> DockerBackend:
        return cls(image=options.image, tools=options.tools, starts=options.starts,
                   run_label=options.run_label, build_network=options.build_network)

    async def sandbox(self, root: Path, name: str, task: Task | None = None,
                      proxy_ports: Sequence[int] = ()) -> DockerSandbox:
        if task is None:
            raise SandboxError("the docker sandbox runs a task's image: it needs the task")
        problem = await asyncio.to_thread(self.problem)
        if problem is not None:
            raise SandboxError(f"the docker sandbox is not available: {problem}")
        if not self._swept:
            self._swept = True
            await sweep()
        image = await self.images.for_task(task)
        async with self._starts:
            box = await DockerSandbox.start(root, name, image=image.name, tools=self.tools,
                                            proxy_ports=proxy_ports,
                                            limits=ContainerLimits.of(task),
                                            run_label=self.run_label, workdir=image.workdir)
        box.removals = self._removals
        return box

    def problem(self) -> str | None:
        return docker_problem()

    async def drain(self) -> None:
        """Until every container this backend's sandboxes left being removed is gone."""
        while self._removals:
            await asyncio.gather(*self._removals, return_exceptions=True)
