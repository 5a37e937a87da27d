"""`harnessrl serve --workers N`: N proxy processes behind one port, every core used.

Each worker is a whole proxy (engine client, sessions, store writer) in its own process.
They share the public port with SO_REUSEPORT, so the kernel spreads new connections over
them; each also listens alone on a private port of the same host. A rollout belongs to
one worker, named by its key (`owner`: a CRC of the key modulo N, so every worker can
tell without asking anyone): its in-memory state (next turn index, issued tool-call ids,
token-mode render state) lives only there. `POST /rollouts` on worker i makes a key that
worker i owns and answers with base URLs at worker i's private port, so a harness talks to
its owner directly; a request that reaches another worker anyway is relayed to the owner
byte for byte (`proxy/relay.py`), so a client that ignores the base URL still works.

All workers write the run's one store (RUN_DIR/trace.db): SQLite in WAL mode takes one
writer at a time across processes, and each worker's writer thread already commits what
it has queued as one transaction, so N workers cost N small commits where one cost one.
They take turns on the store's `WriterLock` (a `flock` the kernel hands over at once), not
on SQLite's busy handler, whose sleeps left a second worker's core a third idle.
One file keeps every reader (viewer, export, runner, trainer) as it is; turn indices
cannot collide, since only a rollout's owner writes its turns.

A worker that dies is restarted on the same private port after `RESTART_DELAY`; its
rollouts resume from the store, as after a restart of a single proxy, and meanwhile calls
for them answer 503 naming the worker (the relay's connection is refused).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import socket
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import wait
from typing import Any

from harnessrl.proxy.sessions import new_key

RESTART_DELAY = 1.0  # seconds before a dead worker is started again
# A worker that dies this soon after it started, this many times in a row, is not going to
# come up (its port is taken, its engine is missing): the whole server stops.
EARLY_DEATH_SECONDS = 10.0
EARLY_DEATHS = 3
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Plan:
    """Where N workers listen: the shared public port, and worker i's own `private[i]`."""

    host: str
    port: int
    private: tuple[int, ...]

    @property
    def n(self) -> int:
        return len(self.private)

    @classmethod
    def make(cls, host: str, port: int, n: int) -> Plan:
        if n < 1:
            raise ValueError(f"--workers must be at least 1, got {n}")
        return cls(host, port, tuple(_free_port(host) for _ in range(n)))


def owner(key: str, n: int) -> int:
    """The worker that holds rollout `key`: the same answer in every process."""
    return zlib.crc32(key.encode()) % n


def owned_key(index: int, n: int) -> str:
    """A new rollout key that worker `index` of `n` owns (N draws on average)."""
    while owner(key := new_key(), n) != index:
        pass
    return key


def listen(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, port), family=family, backlog=2048,
                                reuse_port=reuse_port)


def _free_port(host: str) -> int:
    with contextlib.closing(listen(host, 0, reuse_port=False)) as sock:
        return sock.getsockname()[1]


# -------------------------------------------------------------------- the parent
Target = Callable[..., None]  # target(plan, index, *args), run in the worker's process


@dataclass
class _Worker:
    index: int
    process: Any  # multiprocessing's SpawnProcess
    started: float
    early_deaths: int = 0


def supervise(plan: Plan, target: Target, args: Sequence[Any] = (),
              log: Callable[[str], None] | None = None) -> int:
    """Runs `target(plan, i, *args)` in N spawned processes until this process is told to
    stop (SIGTERM, SIGINT), restarting a worker that dies. Returns the exit code."""
    log = log or partial(print, file=sys.stderr, flush=True)
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited loop

    def start(index: int, early: int = 0) -> _Worker:
        process = context.Process(target=_child, args=(target, plan, index, *args),
                                  name=f"harnessrl-worker-{index}", daemon=False)
        process.start()
        return _Worker(index, process, time.monotonic(), early)

    workers = [start(i) for i in range(plan.n)]
    try:
        while True:
            ready = wait([w.process.sentinel for w in workers])
            for n, worker in enumerate(workers):
                if worker.process.sentinel not in ready:
                    continue
                worker.process.join()
                early = (worker.early_deaths + 1 if time.monotonic() - worker.started
                         < EARLY_DEATH_SECONDS else 0)
                log(f"harnessrl serve: worker {worker.index} (pid {worker.process.pid}, port "
                    f"{plan.private[worker.index]}) exited with {worker.process.exitcode}; "
                    "calls for its rollouts answer 503 until it is back")
                if early >= EARLY_DEATHS:
                    log(f"harnessrl serve: worker {worker.index} died {early} times within "
                        f"{EARLY_DEATH_SECONDS:.0f} s of starting; stopping")
                    return 1
                time.sleep(RESTART_DELAY)
                workers[n] = start(worker.index, early)
                log(f"harnessrl serve: worker {worker.index} restarted (pid "
                    f"{workers[n].process.pid}); its rollouts resume from the store")
    finally:
        _stop(workers)


def _stop(workers: list[_Worker], timeout: float = 30.0) -> None:
    """SIGTERM to every worker (uvicorn drains and the store commits), SIGKILL after
    `timeout`."""
    for worker in workers:
        if worker.process.is_alive():
            with contextlib.suppress(OSError):
                os.kill(worker.process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for worker in workers:
        worker.process.join(max(0.0, deadline - time.monotonic()))
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join()


def _child(target: Target, plan: Plan, index: int, *args: Any) -> None:
    # Die with the parent, even on its SIGKILL: an orphaned worker would keep serving
    # the shared port on its own.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before prctl took effect
        return
    target(plan, index, *args)
