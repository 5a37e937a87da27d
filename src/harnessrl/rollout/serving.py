"""The one assembly of a rollout run in this process: engine -> store -> capture proxy
(served in a thread, `proxy/serve.py`) -> the `Runner` that drives harnesses through it.
`harnessrl run`, the trainers' rollout function and each cluster node's shard all take it
as it is and keep what they need of it (the store, the proxy's URL and weight gate)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from harnessrl.proxy.app import Proxy
from harnessrl.proxy.engines.base import Engine
from harnessrl.proxy.serve import Running, running
from harnessrl.rollout.runner import Runner, RunSettings
from harnessrl.store.writer import TraceStore
from harnessrl.types import Outcome, Sampling


@dataclass(frozen=True)
class Serving:
    """A proxy being served and the runner whose rollouts call it."""

    served: Running
    runner: Runner

    @property
    def store(self) -> TraceStore:
        return self.served.store

    @property
    def url(self) -> str:
        return self.served.url

    @property
    def proxy(self) -> Proxy:
        return self.served.proxy


@contextlib.contextmanager
def serving(config: RunSettings, engine: Engine, run_dir: Path, *, port: int | None = None,
            sampling: Sampling | None = None,
            on_outcome: Callable[[Outcome], None] = lambda _o: None) -> Iterator[Serving]:
    """The proxy in front of `engine`, recording into RUN_DIR/trace.db (served on `port`,
    None: any free one, with the server-wide `sampling`), and a runner over it, for the
    block; the store is closed after it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with running(engine, run_dir, port=port, sampling=sampling) as served:
        yield Serving(served, Runner(config, served.store, served.url, run_dir,
                                     on_outcome=on_outcome,
                                     paused=served.proxy.gate.paused_seconds))
