"""Images for the docker sandbox, and the one way this package calls the docker CLI.

Which image a task runs in, first match wins:

1. the runner's `image` setting (one image for every task; the task's files are copied into
   a mounted workdir, as in the local sandbox);
2. the task's `[environment] docker_image`, by tag, digest or image id: used when the daemon
   has it, else loaded with `docker load` from `docker_image_archive` where the task gives
   one; never pulled (nothing here reaches a registry of images);
3. the task's `environment/Dockerfile`, built once per content hash of environment/ (the tag
   says it), with the build network the runner allows (`none` unless opted in);
4. the base image scripts/docker.sh imports, for a task with neither.

In cases 2 and 3 the image is the task's own: the agent, the oracle and the verifier work in
its WORKDIR with its files as built (`TaskImage.workdir`).

Build network. `none` (the default): a build step reaches nothing, so a Dockerfile can
install only what its context or the base image carries (a local wheel, a .deb, a copied
tree). `host`, opted in (`RolloutSettings.build_network`, `--build-network host`): build steps
share this machine's network namespace and so reach what this machine reaches (here: the
package registries, and this machine's loopback services). It is the only build network a
daemon started with `--bridge=none` has, and it makes no bridge, no veth and no private-range
address. It applies to `docker build` alone: every container the agent and the verifier run
in keeps `--network none` plus the relay to the capture proxy.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harnessrl.rollout.sandbox.base import BuildNetwork, SandboxError
from harnessrl.rollout.tasks.task import Task

BASE_IMAGE = os.environ.get("HARNESSRL_BASE_IMAGE", "harnessrl/base:bookworm")
BUILD_NETWORKS: tuple[BuildNetwork, ...] = ("none", "host")


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


@dataclass(frozen=True)
class TaskImage:
    name: str
    # The image's WORKDIR ("/" when it sets none) when the image is the task's own, where
    # the agent works on the files as built; None: a mounted workdir with the task's files
    # copied in (the base image, or the runner's `image` for every task).
    workdir: str | None = None


def _context_hash(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(directory).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in text.lower())[:100]


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


class Images:
    """Task images (see the module docstring): each build or load at most once at a time; a
    failure is remembered for the run, and so is an image found (one `docker image inspect`
    per image and run, not per rollout)."""

    def __init__(self, override: str | None = None,
                 build_network: BuildNetwork = "none") -> None:
        if build_network not in BUILD_NETWORKS:
            raise ValueError(f"build_network must be one of {', '.join(BUILD_NETWORKS)}, "
                             f"not {build_network!r}")
        self.override = override
        self.build_network = build_network
        self._locks: dict[str, asyncio.Lock] = {}
        self._failed: dict[str, str] = {}
        self._found: dict[tuple[str | None, str | None, str], TaskImage] = {}

    async def for_task(self, task: Task) -> TaskImage:
        key = (task.dockerfile and str(task.dockerfile), task.docker_image, task.id)
        if (found := self._found.get(key)) is None:
            found = self._found[key] = await self._for_task(task)
        return found

    async def _for_task(self, task: Task) -> TaskImage:
        if self.override:
            return TaskImage(await self._existing(self.override, "--image"))
        if task.docker_image is not None:
            name = await self._once(task.docker_image, lambda: self._named(task))
            return TaskImage(name, await workdir_of(name))
        if task.dockerfile is None:
            return TaskImage(await self._existing(
                BASE_IMAGE, f"task {task.id!r} has no Dockerfile; the base image"))
        tag = f"harnessrl-task/{_slug(task.id)}:{_context_hash(task.dockerfile.parent)}"
        name = await self._once(tag, lambda: self._build(task, tag))
        return TaskImage(name, await workdir_of(name))

    async def _once(self, key: str, make) -> str:
        """`make()` under the key's lock, its failure remembered for the run."""
        async with self._locks.setdefault(key, asyncio.Lock()):
            if key in self._failed:
                raise SandboxError(self._failed[key])
            try:
                return await make()
            except SandboxError as error:
                self._failed[key] = str(error)
                raise

    async def _named(self, task: Task) -> str:
        """The task's docker_image from the daemon, or loaded from its archive; never pulled."""
        name = task.docker_image
        assert name is not None
        if (await docker("image", "inspect", name)).returncode == 0:
            return name
        if task.image_archive is None:
            raise SandboxError(
                f"task {task.id!r}: its docker_image {name!r} is not on this daemon and the "
                "task gives no docker_image_archive to load it from (no image is ever "
                f"pulled here; `docker load` it or build it with that tag)")
        loaded = await docker("load", "-q", "-i", str(task.image_archive), timeout=1800)
        if loaded.returncode != 0:
            raise SandboxError(f"task {task.id!r}: `docker load` of {task.image_archive} "
                               f"failed: {_tail(loaded.stdout)}")
        if (await docker("image", "inspect", name)).returncode != 0:
            raise SandboxError(
                f"task {task.id!r}: {task.image_archive} loaded ({loaded.stdout.strip()}) "
                f"but holds no image named {name!r}")
        return name

    async def _build(self, task: Task, tag: str) -> str:
        if (await docker("image", "inspect", tag)).returncode == 0:
            return tag
        assert task.dockerfile is not None
        built = await docker("build", "--network", self.build_network, "--force-rm", "-q",
                             "-t", tag, "-f", str(task.dockerfile),
                             str(task.dockerfile.parent), timeout=1800)
        if built.returncode != 0:
            hint = ("" if self.build_network != "none" else
                    "\n(builds run with --network none: a step that downloads cannot work "
                    "unless the runner allows the build network, --build-network host)")
            raise SandboxError(f"task {task.id!r}: the image did not build from "
                               f"{task.dockerfile}:\n{_tail(built.stdout)}{hint}")
        return tag

    @staticmethod
    async def _existing(image: str, what: str) -> str:
        if (await docker("image", "inspect", image)).returncode != 0:
            raise SandboxError(f"{what}: image {image!r} does not exist on this daemon (no "
                               "image is ever pulled; build it, or run scripts/docker.sh "
                               "for the base image)")
        return image


async def workdir_of(image: str) -> str:
    """The image's WORKDIR, "/" when it sets none (where `docker run` starts)."""
    shown = await docker("image", "inspect", "-f", "{{.Config.WorkingDir}}", image)
    if shown.returncode != 0:
        raise SandboxError(f"cannot inspect image {image!r}: {_tail(shown.stdout, 3)}")
    return shown.stdout.strip() or "/"
