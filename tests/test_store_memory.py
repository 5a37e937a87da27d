"""The store's memory of recent turns is bounded by what is open (issue 49, item 5): a
rollout's turns leave it when the rollout is closed or its outcome written, and its cap
follows the rollouts in flight. Many short rollouts opened and closed: after each close the
memory is back to its floor (nothing kept), on the cache itself, through the app with the
scripted engine, and through `serve --workers 2`."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import httpx
import openai
import pytest

from harnessrl.proxy.app import Proxy
from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
from harnessrl.proxy.sessions import Sessions
from harnessrl.store.layout import Recent, _weight
from harnessrl.store.writer import TraceStore
from harnessrl.types import Outcome, Rollout, Turn
from tests.helpers import ServedProxy
from tests.test_store_layout import conversation
from tests.test_workers import new_rollouts, serve_workers


def never_read(_db: sqlite3.Connection, _key: str) -> list[Turn]:
    return []


def test_the_cache_drops_a_closed_rollout_and_its_cap_follows_those_in_flight() -> None:
    recent = Recent(never_read, per_rollout=1_000_000, floor=3_000_000)
    db = sqlite3.connect(":memory:")
    assert recent.budget == 3_000_000 and recent.size() == (0, 0)
    for n in range(200):  # many short rollouts, two open at a time
        keys = [f"a{n}", f"b{n}"]
        for key in keys:
            recent.opened(key)
        assert recent.budget == 3_000_000  # two in flight: still the floor
        for turn in conversation(keys[0], 4) + conversation(keys[1], 2):
            recent.get(db, turn.rollout)
            recent.keep([turn])
        kept = conversation(keys[0], 4)[1:] + conversation(keys[1], 2)
        assert recent.size() == (2, sum(map(_weight, kept)))  # the last 3 turns of each
        recent.closed(keys[0])
        assert recent.size() == (1, sum(map(_weight, kept[3:])))
        recent.closed(keys[1])
        assert recent.size() == (0, 0)  # back to its floor after each close
        late = conversation(keys[1], 3)[2]  # a turn in flight when its rollout closed
        assert recent.get(db, late.rollout) == []
        recent.keep([late])
        assert recent.size() == (0, 0)
    for n in range(5):
        recent.opened(f"open{n}")
    assert recent.budget == 5_000_000  # the cap follows the rollouts in flight
    recent.closed("open0")
    assert recent.budget == 4_000_000


def test_over_the_cap_the_least_recently_written_rollout_goes_first() -> None:
    turns = {key: conversation(key, 3, grow=4000) for key in "abc"}
    weight = sum(map(_weight, turns["a"]))
    recent = Recent(never_read, per_rollout=weight + 10, floor=0)
    db = sqlite3.connect(":memory:")
    for key in "ab":
        recent.opened(key)
        recent.get(db, key)
        recent.keep(turns[key])
    assert recent.size()[0] == 2
    recent.get(db, "c")  # not seen opened: shares the cap of the two in flight
    recent.keep(turns["c"])
    recent.get(db, "c")
    assert recent.size()[0] == 2 and recent.find("a", lambda _t: True) is None
    assert recent.find("b", lambda _t: True) == turns["b"][-1]


def test_closing_or_writing_the_outcome_empties_the_stores_memory(tmp_path: Path) -> None:
    async def go(store: TraceStore) -> list[tuple[int, int]]:
        sizes = []
        for n in range(30):
            key = f"r{n}"
            await store.put_rollout(Rollout(key, 1.0))
            for turn in conversation(key, 4):
                await store.add_turn(turn)
            assert store.kept()[0] == 1 and store.kept()[1] > 0
            if n % 2:
                await store.put_rollout(Rollout(key, 1.0, closed=2.0))
            else:
                await store.put_outcome(Outcome("h", "1", "t", n, key, "done", reward=1.0))
            sizes.append(store.kept())
        return sizes

    with TraceStore(tmp_path) as store:
        assert asyncio.run(go(store)) == [(0, 0)] * 30
        assert store.turns("r7") == conversation("r7", 4)


def calls(url: str, key: str, n: int) -> None:
    client = openai.OpenAI(base_url=f"{url}/r/{key}/v1", api_key=key, max_retries=0)
    messages: list = []
    for i in range(n):
        messages.append({"role": "user", "content": f"step {i} " + "words " * 200})
        reply = client.chat.completions.create(model="m", messages=messages)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})


def test_many_short_rollouts_through_the_app_leave_nothing_kept(tokenizer, tmp_path) -> None:
    engine = ScriptedEngine(tokenizer, replay(["Done with this step."]), model="scripted")
    proxy = Proxy(engine, Sessions(TraceStore(tmp_path / "run")))
    with ServedProxy(proxy).running() as served:
        for _ in range(25):
            key = served.new_rollout()["key"]
            calls(served.url, key, 3)
            kept = httpx.get(f"{served.url}/health").json()["kept_turns"]
            assert kept["rollouts"] == 1 and kept["bytes"] > 0
            assert httpx.delete(f"{served.url}/rollouts/{key}").status_code == 200
            kept = httpx.get(f"{served.url}/health").json()["kept_turns"]
            assert kept == {"rollouts": 0, "bytes": 0}


@pytest.mark.slow
def test_many_short_rollouts_through_two_workers_leave_nothing_kept(tmp_path, tiny_model):
    with serve_workers(tmp_path, tiny_model) as served:
        workers = [f"http://127.0.0.1:{p}" for p in served.private]
        for _ in range(4):
            for made in [r for rs in new_rollouts(served, 2).values() for r in rs[:2]]:
                calls(served.url, made["key"], 3)  # through the shared port: relayed or not
                owner = made["base_url"].rsplit("/r/", 1)[0]
                assert httpx.get(f"{owner}/health").json()["kept_turns"]["rollouts"] == 1
                assert httpx.delete(f"{served.url}/rollouts/{made['key']}").status_code == 200
                for worker in workers:  # each worker's own memory, at its own port
                    kept = httpx.get(f"{worker}/health").json()["kept_turns"]
                    assert kept == {"rollouts": 0, "bytes": 0}, worker
