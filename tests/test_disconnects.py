"""Issue 32: a client that leaves before the last byte of a non-streamed answer gets its
turn stored `cancelled`, never `ok`, in every dialect: while the engine works, while the
turn is being committed (the store commits a turn before its last byte leaves), and
through a worker that relays the call to its owner (`serve --workers`, proxy/relay.py).
The engine is tests/raw_engine.py's scripted stand-in for vLLM."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from harnessrl.proxy.engines.vllm import VLLMEngine
from harnessrl.proxy.serve import running
from harnessrl.types import Turn
from tests.dialects import IDS, WIRE, WireDialect
from tests.raw_engine import ENGINE_DELAY, LEAVE_AFTER, RawEngine, call_and_leave, stored


@pytest.mark.parametrize("dialect", WIRE, ids=IDS)
def test_a_client_gone_before_the_answer_is_cancelled(tmp_path: Path, dialect: WireDialect
                                                      ) -> None:
    with RawEngine(delay=ENGINE_DELAY).running() as engine, \
            running(VLLMEngine(engine.url), tmp_path / "run") as proxy:
        made = httpx.post(f"{proxy.url}/rollouts", json={}).json()
        for _ in range(3):
            call_and_leave(made["base_url"], dialect)
        turns = stored(lambda: proxy.store.turns(made["key"]), 3)
        assert [t.status for t in turns] == ["cancelled"] * 3


@pytest.mark.parametrize("dialect", WIRE, ids=IDS)
def test_a_client_gone_while_its_turn_is_committed_is_cancelled(
        tmp_path: Path, dialect: WireDialect) -> None:
    """The engine answers at once; the client leaves while the turn is being committed (a
    slow store), so before the answer's first byte could leave: the turn, committed ok
    for durability, becomes cancelled. A client that stays gets its answer and `ok`."""
    with RawEngine().running() as engine, \
            running(VLLMEngine(engine.url), tmp_path / "run") as proxy:
        commit = proxy.store.add_turn

        async def slow_commit(turn: Turn, *, alone: bool = False) -> None:
            await commit(turn, alone=alone)
            await asyncio.sleep(4 * LEAVE_AFTER)  # committed; its answer not yet sent

        proxy.store.add_turn = slow_commit  # type: ignore[method-assign]
        made = httpx.post(f"{proxy.url}/rollouts", json={}).json()
        call_and_leave(made["base_url"], dialect)
        served = type("Served", (), {"root": made["base_url"]})
        assert dialect.post(served).status_code == 200
        turns = stored(lambda: proxy.store.turns(made["key"]), 2)
        assert [t.status for t in turns] == ["cancelled", "ok"]
        assert turns[0].completion is not None  # what was sampled is kept


def test_the_relay_cancels_a_turn_its_client_left_before_it_was_passed_on() -> None:
    """The owner committed the turn ok and answered; the relay's client was gone before
    the relay could pass the answer on: nothing is sent, and the relay cancels the turn
    the owner named (`x-harnessrl-turn`)."""
    from harnessrl.proxy.relay import Front
    from harnessrl.proxy.workers import Plan, owned_key

    async def main() -> tuple[list[tuple[str, int]], list[dict], list[bytes]]:
        gone = asyncio.Event()
        requests: list[bytes] = []

        async def owner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            requests.append(head)
            await reader.readexactly(2)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Harnessrl-Turn: 3\r\n"
                         b"Content-Type: application/json\r\n\r\n{}")
            await writer.drain()
            gone.set()  # the client leaves as the owner's answer is on its way
            await asyncio.sleep(0.5)
            writer.close()

        server = await asyncio.start_server(owner, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        cancelled: list[tuple[str, int]] = []

        async def cancel_turn(key: str, index: int) -> None:
            cancelled.append((key, index))

        async def app(_scope: Any, _receive: Any, _send: Any) -> None:
            raise AssertionError("a call for the other worker's rollout is served here")

        front = Front(app, Plan("127.0.0.1", 1, (port, 1)), 1, 1 << 20, cancel_turn)
        key = owned_key(0, 2)
        sent: list[dict] = []
        bodies = iter([{"type": "http.request", "body": b"{}", "more_body": False}])

        async def receive() -> dict:
            if (message := next(bodies, None)) is not None:
                return message
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            sent.append(message)

        path = f"/r/{key}/v1/chat/completions"
        scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
                 "query_string": b"", "headers": [(b"content-type", b"application/json")],
                 "server": ("127.0.0.1", 1), "root_path": ""}
        await front(scope, receive, send)
        await front.close()
        server.close()
        return [(k, i) for k, i in cancelled], sent, requests

    cancelled, sent, requests = asyncio.run(main())
    assert sent == []  # nothing for a client that is not there
    assert len(cancelled) == 1 and cancelled[0][1] == 3
    assert b"x-harnessrl-relayed: 1" in requests[0].lower()
