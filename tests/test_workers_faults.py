"""Issue 32 through `serve --workers 2` (real processes) and a raw scripted engine
(tests/raw_engine.py): slow readers get the whole stream and an ok turn with the engine's
exact ids, and clients that leave before a non-streamed answer get their turn cancelled,
whether the call reaches its rollout's owner or a worker that relays it (the other worker's
own port relays every call; the shared port, whichever the kernel picks)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harnessrl.proxy.workers import owner
from harnessrl.store.reader import TraceReader
from tests.dialects import WIRE
from tests.helpers import serve_workers_cli
from tests.raw_engine import (
    ENGINE_DELAY,
    ENGINE_TIMEOUT,
    READERS,
    RawEngine,
    call_and_leave,
    stored,
    whole_and_exact,
)

pytestmark = pytest.mark.slow  # two worker processes start (some 10 s on a busy machine)


class Workers:
    def __init__(self, engine: RawEngine, url: str, private: list[int], run_dir: Path):
        self.engine, self.url, self.private, self.run_dir = engine, url, private, run_dir

    def rollout(self, worker: int) -> str:
        """A new rollout that `worker` owns (made through the shared port)."""
        for _ in range(100):
            key = httpx.post(f"{self.url}/rollouts", json={}).json()["key"]
            if owner(key, 2) == worker:
                return key
        raise AssertionError(f"no rollout of worker {worker}")

    def turns(self, key: str) -> list:
        with TraceReader(self.run_dir) as reader:
            return reader.turns(key)

    def routes(self, key: str) -> dict[str, str]:
        """Where a call for `key` can go: its owner's port, the other's (a relay), the
        shared one."""
        mine = owner(key, 2)
        return {"owner": f"http://127.0.0.1:{self.private[mine]}",
                "relay": f"http://127.0.0.1:{self.private[1 - mine]}", "shared": self.url}


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    run_dir = tmp_path_factory.mktemp("run")
    with RawEngine().running() as engine, serve_workers_cli(
            ["--engine-url", engine.url, "--engine-timeout", str(ENGINE_TIMEOUT)],
            run_dir) as (url, private):
        yield Workers(engine, url, private, run_dir)


@pytest.mark.parametrize("route", ["owner", "relay", "shared"])
@pytest.mark.parametrize("reader", list(READERS))
def test_a_slow_reader_through_two_workers(workers: Workers, reader: str, route: str
                                           ) -> None:
    how = READERS[reader]
    engine = workers.engine
    engine.delay, engine.tokens, engine.width = 0.0, how.tokens, how.width
    key = workers.rollout(0)
    raw = how.read(workers.routes(key)[route], key)
    whole_and_exact(raw, stored(lambda: workers.turns(key), 1), engine)


@pytest.mark.parametrize("route", ["owner", "relay", "shared"])
def test_a_client_gone_before_the_answer_through_two_workers(workers: Workers, route: str
                                                             ) -> None:
    engine = workers.engine
    engine.delay, engine.tokens, engine.width = ENGINE_DELAY, 6, 0
    key = workers.rollout(1)
    base = f"{workers.routes(key)[route]}/r/{key}"
    for dialect in WIRE:
        call_and_leave(base, dialect)
    turns = stored(lambda: workers.turns(key), len(WIRE))
    assert [t.status for t in turns] == ["cancelled"] * len(WIRE)
