"""The `docker` sandbox: a task's own image, built from its `environment/Dockerfile`.

It keeps the local sandbox's layout (work/, home/, tmp/ and the verifier's tests/, logs/
on the host) and bind-mounts that one directory into the container at the same path, so
paths mean the same inside and out and files move without `docker cp`. Nothing else of the
host is writable inside: a write outside the sandbox directory lands in the container's
own filesystem and is gone with it.

Network: always `--network none` (the daemon needs no bridge). The capture proxy is reached
through the local sandbox's Unix-socket relay: the relay directory is mounted in, and the
container's first process (netns_launcher.py, run by the mounted Python) listens on
127.0.0.1:<port> inside and hands every connection to the socket. The proxy is the only
address the agent can reach.

Runtimes: the harness prefixes, the Python runtimes they and the verifier use (this
interpreter, its venv, each harness venv's base Python) and Node are mounted read-only, so an
unmodified task image needs nothing installed. An image that cannot run them (another libc)
fails the start-up self-check, an infrastructure error that says so.

Hygiene: every container carries labels naming its owner process (pid and start time); on
SIGINT/SIGTERM (and at exit) the process removes each container it started, and `sweep()`
removes those whose owner is gone (a runner that was SIGKILLed). Commands run with
`docker exec`; their deadline is kept on this side and, as in the local sandbox, every
process a command started is found by its marker variable (containers' processes are
visible in this host's /proc) and killed when it ends or times out.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harnessrl.rollout.sandbox import (
    OUTPUT_CAP,
    ExecResult,
    Limits,
    LocalSandbox,
    SandboxError,
    check_env,
    kill_marked,
)
from harnessrl.rollout.tasks import Task

BASE_IMAGE = os.environ.get("HARNESSRL_BASE_IMAGE", "harnessrl/base:bookworm")
LABEL = "harnessrl.owner"  # "<pid>:<start time>" of the process that started the container
RUN_LABEL = "harnessrl.run"  # the run directory, for `docker ps -a --filter label=...`
OPT = "/opt/harnessrl"  # inside: the launcher, the probe and bin/node
RUNTIME_BIN = f"{OPT}/bin"
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_HERE = Path(__file__).parent
_FILES = {"netns_launcher.py": f"{OPT}/relay.py", "sandbox_probe.py": f"{OPT}/probe.py"}
_SYSTEM = ("/", "/usr", "/usr/local", "/bin", "/lib", "/opt")  # never mounted over an image


def docker_problem() -> str | None:
    """Why the docker sandbox cannot run here, or None."""
    if shutil.which("docker") is None:
        return "the docker command is not installed (scripts/docker.sh installs docker.io)"
    try:
        probe = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                               capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 30 s"
    if probe.returncode != 0:
        return (f"no Docker daemon answers ({probe.stderr.strip()[:300]}); "
                "scripts/docker.sh starts one as root")
    return None


async def docker(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """One docker CLI call (the legacy builder: no buildx plugin is needed)."""
    env = os.environ | {"DOCKER_BUILDKIT": "0"}
    proc = await asyncio.create_subprocess_exec(
        "docker", *args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, env=env)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise SandboxError(f"`docker {args[0]}` did not finish within {timeout:g} s") from None
    return subprocess.CompletedProcess(args, proc.returncode or 0,
                                       out.decode(errors="replace"), "")


# -- owners, signals and the sweep ------------------------------------------------------------

def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner() -> str:
    return f"{os.getpid()}:{_start_time(os.getpid())}"


def _alive(label: str) -> bool:
    pid, _, started = label.partition(":")
    return pid.isdigit() and _start_time(int(pid)) == started


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
    """Once per process: remove our containers on SIGINT, SIGTERM and at exit. A handler
    someone else installed is left alone (its owner decides how to stop)."""
    if getattr(_install_cleanup, "done", False):
        return
    _install_cleanup.done = True  # type: ignore[attr-defined]
    atexit.register(lambda: remove_now(sorted(_LIVE)))
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError):  # not the main thread
            if signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler):
                signal.signal(signum, _on_signal)


async def sweep() -> list[str]:
    """Remove the containers whose owner process is gone; their names."""
    listed = await docker("ps", "-a", "--filter", f"label={LABEL}", "--format",
                          f'{{{{.Names}}}} {{{{.Label "{LABEL}"}}}}')
    if listed.returncode != 0:
        raise SandboxError(f"docker ps failed: {listed.stdout.strip()[-500:]}")
    dead = [name for name, _, label in (line.partition(" ") for line in
                                        listed.stdout.splitlines()) if not _alive(label)]
    if dead:
        await docker("rm", "-f", *dead)
    return dead


# -- images ----------------------------------------------------------------------------------

def _context_hash(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(directory).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


class Images:
    """Task images: built once per content hash of environment/ (the tag says it), each
    build at most once at a time; a failed build is remembered for the run, and so is an
    image found (one `docker image inspect` per image and run, not per rollout)."""

    def __init__(self, override: str | None = None) -> None:
        self.override = override
        self._locks: dict[str, asyncio.Lock] = {}
        self._failed: dict[str, str] = {}
        self._found: dict[tuple[str | None, str], str] = {}

    async def for_task(self, task: Task) -> str:
        key = (task.dockerfile and str(task.dockerfile), task.id)
        if (found := self._found.get(key)) is None:
            found = self._found[key] = await self._for_task(task)
        return found

    async def _for_task(self, task: Task) -> str:
        if self.override:
            return await self._existing(self.override, "--image")
        if task.dockerfile is None:
            return await self._existing(BASE_IMAGE, f"task {task.id!r} has no Dockerfile; the "
                                        "base image")
        context = task.dockerfile.parent
        tag = f"harnessrl-task/{_slug(task.id)}:{_context_hash(context)}"
        async with self._locks.setdefault(tag, asyncio.Lock()):
            if tag in self._failed:
                raise SandboxError(self._failed[tag])
            if (await docker("image", "inspect", tag)).returncode == 0:
                return tag
            built = await docker("build", "--network", "none", "--force-rm", "-q", "-t", tag,
                                 "-f", str(task.dockerfile), str(context), timeout=1800)
            if built.returncode != 0:
                tail = "\n".join(built.stdout.strip().splitlines()[-15:])
                self._failed[tag] = (f"task {task.id!r}: the image did not build from "
                                     f"{task.dockerfile}:\n{tail}")
                raise SandboxError(self._failed[tag])
            return tag

    @staticmethod
    async def _existing(image: str, what: str) -> str:
        if (await docker("image", "inspect", image)).returncode != 0:
            raise SandboxError(f"{what}: image {image!r} does not exist on this daemon (no "
                               "image is ever pulled; build it, or run scripts/docker.sh "
                               "for the base image)")
        return image


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in text.lower())[:100]


# -- limits and runtimes ---------------------------------------------------------------------

@dataclass(frozen=True)
class ContainerLimits:
    cpus: float = 2.0
    memory_mb: int = 4096
    pids: int = 4096

    @classmethod
    def of(cls, task: Task) -> ContainerLimits:
        """Harbor's task.toml [environment] cpus and memory_mb (or memory = "2G")."""
        if task.source is None or not (task.source / "task.toml").is_file():
            return cls()
        try:
            table = tomllib.loads((task.source / "task.toml").read_text()).get("environment")
        except (OSError, tomllib.TOMLDecodeError):
            return cls()
        if not isinstance(table, dict):
            return cls()
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
    bundled = _HERE / "bundled_tasks"
    if bundled.is_relative_to(sys.prefix) or bundled.is_relative_to(sys.base_prefix):
        mounts += ["--mount", f"type=tmpfs,destination={bundled}"]
    return mounts


# -- the sandbox -----------------------------------------------------------------------------

class DockerSandbox(LocalSandbox):
    container: str = ""
    image: str = ""
    removals: set[asyncio.Future[None]] | None = None

    @classmethod
    async def start(cls, root: Path, name: str, *, image: str, tools: Path,
                    proxy_ports: Sequence[int] = (), allowed_env: Mapping[str, str] = {},
                    limits: ContainerLimits = ContainerLimits(), run_label: str = "",
                    kill_grace: float = 2.0) -> DockerSandbox:
        """A running container of `image` with the sandbox directory mounted, the proxy
        ports relayed in, and the runtimes mounted; proved by a self-check."""
        box = await cls.create(root, name, allowed_env=allowed_env, kill_grace=kill_grace,
                               limits=Limits(None, None, None, None))
        box.container, box.image = f"harnessrl-{name[:80]}-{box.token[:8]}", image
        try:
            await box._start_container(tools, proxy_ports, limits, run_label)
            await box._check()
        except BaseException:
            await box.close()
            raise
        return box

    async def _start_container(self, tools: Path, ports: Sequence[int],
                               limits: ContainerLimits, run_label: str) -> None:
        try:
            await self._start_relays(ports)
        except OSError as error:
            raise SandboxError(f"cannot start the proxy relay: {error}") from error
        relays = [a for port, path in self._relays for a in ("--relay", f"{port}={path}")]
        python = os.path.realpath(sys.executable)
        _install_cleanup()
        _LIVE.add(self.container)
        started = await docker(
            "run", "-d", "--name", self.container, "--label", f"{LABEL}={owner()}",
            "--label", f"{RUN_LABEL}={run_label}", "--network", "none", "--init",
            "--security-opt", "no-new-privileges", *limits.args(),
            "-v", f"{self.directory}:{self.directory}",
            "-v", f"{self._relay_dir}:{self._relay_dir}", *runtime_mounts(tools),
            "-w", str(self.workdir), "--entrypoint", python, self.image,
            "-I", _FILES["netns_launcher.py"], *relays, "--", *self._probe())
        if started.returncode != 0:
            raise SandboxError(f"docker run {self.image} failed: {started.stdout.strip()[-800:]}")

    def _probe(self) -> list[str]:
        """The container's first command after the relay listens: the self-check, its
        report written to `ready`, then it waits, keeping the container up."""
        node = ["--node", f"{RUNTIME_BIN}/node"] if shutil.which("node") else []
        ports = [str(port) for port, _path in self._relays]
        return [os.path.realpath(sys.executable), "-I", _FILES["sandbox_probe.py"], *node,
                "--report", str(self._relay_dir / "ready"), *ports, "--", str(self.workdir)]

    async def _check(self) -> None:
        """The runtimes run in this image and the relayed proxy answers, or why not."""
        await self._relay_ready()
        report = self._relay_dir / "ready"
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
        ready, polls = self._relay_dir / "ready", 0
        while not ready.exists() and time.monotonic() < deadline:
            polls += 1
            if polls % 25 == 0:
                state = await docker("inspect", "-f", "{{.State.Running}}", self.container)
                if state.stdout.strip() != "true":
                    return  # the check that follows says why
            await asyncio.sleep(0.02)

    async def run(self, command: str | list[str], *, env: Mapping[str, str] | None = None,
                  timeout: float, cwd: Path | None = None) -> ExecResult:
        if self.closed:
            raise SandboxError(f"sandbox {self.directory} is closed")
        check_env(env or {})
        merged = {k: v for k, v in self._env.items() if k != "PATH"} | dict(env or {})
        # The image's own PATH (not the host's), Node first.
        merged["PATH"] = f"{RUNTIME_BIN}:{merged.get('PATH') or IMAGE_PATH}"
        argv = ["docker", "exec", "-w", str(self._inside(str(cwd or self.workdir)))]
        for key, value in merged.items():
            argv += ["-e", f"{key}={value}"]
        inner = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *argv, self.container, *inner, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
        timed_out = False
        talk = asyncio.ensure_future(proc.communicate())
        try:
            await asyncio.wait({talk}, timeout=timeout)
            if not talk.done():
                timed_out = True
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
        await super().close()

    async def _remove(self) -> None:
        await docker("rm", "-f", self.container, timeout=120)
        _LIVE.discard(self.container)


class DockerBackend:
    """One runner's docker side: task images, a cap on concurrent container starts (apart
    from the rollouts' concurrency), the start-up sweep of dead runners' containers, and
    the containers still being removed (`drain` before the runner returns)."""

    def __init__(self, *, image: str | None, tools: Path, starts: int = 2,
                 run_label: str = "") -> None:
        self.images = Images(image)
        self.tools = tools
        self.run_label = run_label
        self._starts = asyncio.Semaphore(starts)
        self._swept = False
        self._removals: set[asyncio.Future[None]] = set()

    async def sandbox(self, root: Path, name: str, task: Task,
                      proxy_ports: Sequence[int]) -> DockerSandbox:
        problem = await asyncio.to_thread(docker_problem)
        if problem is not None:
            raise SandboxError(f"the docker sandbox is not available: {problem}")
        if not self._swept:
            self._swept = True
            await sweep()
        image = await self.images.for_task(task)
        async with self._starts:
            box = await DockerSandbox.start(root, name, image=image, tools=self.tools,
                                            proxy_ports=proxy_ports,
                                            limits=ContainerLimits.of(task),
                                            run_label=self.run_label)
        box.removals = self._removals
        return box

    async def drain(self) -> None:
        """Until every container this backend's sandboxes left being removed is gone."""
        while self._removals:
            await asyncio.gather(*self._removals, return_exceptions=True)
