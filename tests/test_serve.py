"""`proxy.serve.Server`: uvicorn's server with a one-second tick that still stops at once."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from harnessrl.proxy.serve import Server, in_thread


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_the_server_ticks_once_a_second_and_stops_at_once(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    ticks: list[int] = []
    on_tick = Server.on_tick

    async def counted(self: Server, counter: int) -> bool:
        ticks.append(counter)
        return await on_tick(self, counter)

    monkeypatch.setattr(Server, "on_tick", counted)
    with in_thread(_app) as (url, _server):
        answer = httpx.get(url)
        assert answer.text == "ok" and answer.headers["date"].endswith(" GMT")
        time.sleep(1.5)
        assert 2 <= len(ticks) <= 3  # uvicorn's own tick would have woken 15 times
        assert all(counter % 10 == 0 for counter in ticks)  # each refreshes the Date header
        stopped = time.monotonic()  # leaving the block sets should_exit, joins the thread
    assert time.monotonic() - stopped < 0.5  # not at the next tick, up to 1 s away
