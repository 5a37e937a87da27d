"""The `docker` sandbox, for users who have a Docker daemon.

It keeps the local sandbox's layout (work/, home/, tmp/ and the verifier's tests/, logs/
on the host) and bind-mounts that directory into a container at the same path, so paths
mean the same inside and out, and files move in and out without `docker cp`. Commands
run with `docker exec` under `timeout`, with only the sandbox's minimal environment; the
container is removed when the sandbox closes.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from harnessrl.rollout.sandbox import ExecResult, LocalSandbox, SandboxError, check_env

KILL_AFTER = 5  # seconds between TERM and KILL when a command overruns


def docker_problem() -> str | None:
    """Why the docker sandbox cannot run here, or None."""
    if shutil.which("docker") is None:
        return "the docker command is not installed"
    probe = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"no Docker daemon answers: {probe.stderr.strip()[:300]}"
    return None


class DockerSandbox(LocalSandbox):
    container: str = ""

    @classmethod
    async def start(cls, root: Path, name: str, *, image: str,
                    allowed_env: Mapping[str, str] = {}, read_only: Sequence[Path] = (),
                    network: str = "bridge") -> DockerSandbox:
        """A container of `image` with the sandbox directory mounted; `read_only` host
        paths (the harness tools directory) are mounted read-only at the same place."""
        problem = await asyncio.to_thread(docker_problem)
        if problem is not None:
            raise SandboxError(f"the docker sandbox is not available: {problem}")
        box = await cls.create(root, name, allowed_env=allowed_env)
        box.container = f"harnessrl-{name}-{box.token[:8]}"
        mounts = ["-v", f"{box.directory}:{box.directory}"]
        for path in read_only:
            mounts += ["-v", f"{path}:{path}:ro"]
        started = await asyncio.to_thread(
            subprocess.run, ["docker", "run", "-d", "--rm", "--name", box.container,
                             "--network", network, *mounts, image, "sleep", "infinity"],
            capture_output=True, text=True)
        if started.returncode != 0:
            await LocalSandbox.close(box)
            raise SandboxError(f"docker run {image} failed: {started.stderr.strip()[:500]}")
        return box

    async def run(self, command: str | list[str], *, env: Mapping[str, str] | None = None,
                  timeout: float, cwd: Path | None = None) -> ExecResult:
        check_env(env or {})
        # The container's own PATH, not the host's.
        merged = {k: v for k, v in self._env.items() if k != "PATH"} | dict(env or {})
        argv = ["docker", "exec", "-w", str(cwd or self.workdir)]
        for key, value in merged.items():
            argv += ["-e", f"{key}={value}"]
        inner = ["sh", "-c", command] if isinstance(command, str) else list(command)
        argv += [self.container, "timeout", "-k", str(KILL_AFTER), f"{timeout:.0f}", *inner]
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stdout, stderr = await proc.communicate()
        elapsed = time.monotonic() - started
        # 124: `timeout` stopped it with TERM; 137 after the KILL that follows.
        timed_out = proc.returncode == 124 or (proc.returncode == 137 and elapsed >= timeout)
        return ExecResult(exit_code=None if timed_out else proc.returncode, stdout=stdout,
                          stderr=stderr, timed_out=timed_out, seconds=elapsed)

    async def close(self) -> None:
        if self.container:
            await asyncio.to_thread(subprocess.run, ["docker", "rm", "-f", self.container],
                                    capture_output=True)
        await super().close()
