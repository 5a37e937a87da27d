"""The sandbox backends by name: the one place a caller gets a sandbox from.

A backend is made from `BackendOptions` (what the caller asks: limits, network, image, ...)
and hands out sandboxes (the `Sandbox` protocol of base.py), one per call, then `drain`s
what it still has to clean before its caller returns. `harnessrl run/eval/train` (the
runner), `tasks check`, the oracle's dry runs and `conformance` all ask `backend(name,
options)`; each Ray rollout node runs the ordinary runner, so a cluster's nodes use the
backend their `[rollout] sandbox` names, from this same table. A new backend (a remote or
managed sandbox, Kubernetes) is one entry here: a factory from options to a
`SandboxBackend`. A name not in the table is an `UnknownBackend` error listing those that
are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from harnessrl.errors import UnknownBackend
from harnessrl.rollout.sandbox.base import DEFAULT_OPTIONS, BackendOptions, Sandbox
from harnessrl.rollout.sandbox.docker import DockerBackend
from harnessrl.rollout.sandbox.local import LocalBackend
from harnessrl.rollout.tasks.task import Task


class SandboxBackend(Protocol):
    async def sandbox(self, root: Path, name: str, task: Task | None = None,
                      proxy_ports: Sequence[int] = ()) -> Sandbox:
        """A started sandbox at `root/name` (which must not exist yet) for `task` (a
        backend that runs a task's own image needs it); `proxy_ports` are the host
        loopback ports (the capture proxy) its commands may reach."""
        ...

    async def drain(self) -> None:
        """Until what this backend's closed sandboxes left behind is cleaned up."""
        ...

    def problem(self) -> str | None:
        """Why this backend cannot make sandboxes here (as its options ask), or None."""
        ...


BackendFactory = Callable[[BackendOptions], SandboxBackend]

BACKENDS: dict[str, BackendFactory] = {
    "local": LocalBackend.of,
    "docker": DockerBackend.of,
}


def names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def check(name: str) -> str:
    """`name` if a backend has it, else an `UnknownBackend` naming the known ones."""
    if name not in BACKENDS:
        raise UnknownBackend(f"unknown sandbox backend {name!r}; the known ones are "
                             f"{', '.join(BACKENDS)}")
    return name


def backend(name: str, options: BackendOptions = DEFAULT_OPTIONS) -> SandboxBackend:
    """The backend called `name`, made with `options`."""
    return BACKENDS[check(name)](options)
