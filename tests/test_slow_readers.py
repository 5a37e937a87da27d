"""Issue 32: a client that reads slowly is not an engine that went silent. The proxy stops
reading the engine while its own client is behind (back-pressure); that time never counts
against `--engine-timeout`. Raw clients with a small receive buffer read a long stream from
an engine at full speed (tests/raw_engine.py, scripted), through one proxy and through the
shared port of `serve --workers 2`: each gets the whole stream, and its turn is stored ok
with the engine's exact ids."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from harnessrl.proxy.engines.vllm import VLLMEngine
from harnessrl.proxy.serve import running
from tests.raw_engine import ENGINE_TIMEOUT, READERS, RawEngine, whole_and_exact


@pytest.mark.parametrize("reader", list(READERS))
def test_a_slow_reader_gets_the_whole_stream_and_an_ok_turn(tmp_path: Path, reader: str
                                                            ) -> None:
    how = READERS[reader]
    with RawEngine(tokens=how.tokens, width=how.width).running() as engine, \
            running(VLLMEngine(engine.url, read_timeout=ENGINE_TIMEOUT),
                    tmp_path / "run") as proxy:
        key = httpx.post(f"{proxy.url}/rollouts", json={}).json()["key"]
        raw = how.read(proxy.url, key)
        whole_and_exact(raw, proxy.store.turns(key), engine)
