"""The proxy's weight gate: during a swap new model calls wait (and then succeed), calls
already running finish first, and each turn records the version that sampled it.

The engine is the scripted one (named as such), slowed per token so a stream is still
running when the swap starts; the clients are real HTTP clients on threads."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
from harnessrl.proxy.gate import GateTimeout, WeightGate
from tests.helpers import ServedProxy, make_proxy


def _chat(url: str, key: str, stream: bool) -> httpx.Response:
    body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}],
            "stream": stream}
    return httpx.post(f"{url}/r/{key}/v1/chat/completions", json=body, timeout=60)


def test_calls_wait_during_a_swap_and_running_streams_finish_on_the_old_weights(
        tmp_path, tokenizer):
    engine = ScriptedEngine(tokenizer, replay(["word " * 40]), token_delay=0.02)
    engine.weight_version = "step-0"
    served = ServedProxy(make_proxy(engine, tmp_path))
    gate = served.proxy.gate
    results: dict[str, httpx.Response] = {}
    finished: dict[str, float] = {}

    def call(name: str, key: str, stream: bool) -> None:
        results[name] = _chat(served.url, key, stream)
        finished[name] = time.monotonic()

    with served.running():
        key = served.new_rollout()["key"]
        running = threading.Thread(target=call, args=("running", key, True))
        running.start()
        while gate.inflight == 0:  # the stream is in the engine (about 0.8 s of tokens)
            time.sleep(0.005)
        gate.hold(timeout=30)  # returns only once the running stream has finished
        # its turn is stored whole (the proxy commits it before the last bytes leave)
        assert gate.inflight == 0 and [t.status for t in served.store.turns(key)] == ["ok"]
        # The swap: the engine now serves new weights.
        engine.weight_version = "step-1"
        held = [threading.Thread(target=call, args=(f"held-{s}", key, s)) for s in (True, False)]
        for t in held:
            t.start()
        deadline = time.monotonic() + 60
        while gate.waiting < 2 and time.monotonic() < deadline:  # both reached the proxy
            time.sleep(0.01)
        time.sleep(0.3)
        assert gate.waiting == 2 and gate.inflight == 0
        assert not any(name.startswith("held") for name in finished), "a call passed the gate"
        released = time.monotonic()
        gate.release()
        for t in (running, *held):
            t.join(30)
        turns = served.store.turns(key)

    assert all(r.status_code == 200 for r in results.values()), {
        n: r.text[:200] for n, r in results.items()}
    assert all(finished[n] >= released for n in ("held-True", "held-False"))
    assert len(gate.waits) == 2 and min(gate.waits) > 0.1 and gate.holds == 1
    assert [t.status for t in turns] == ["ok"] * 3
    # the stream that ran across the start of the hold was sampled, and is recorded, as
    # step-0; the calls that waited were sampled by step-1
    assert [t.weight_version for t in sorted(turns, key=lambda t: t.index)] == [
        "step-0", "step-1", "step-1"]


def test_a_hold_that_cannot_drain_gives_up_and_opens_the_gate():
    gate = WeightGate()
    import asyncio

    asyncio.run(gate.admit())  # a call that never leaves
    with pytest.raises(GateTimeout, match="1 model call"):
        gate.hold(timeout=0.05)
    assert not gate.held
    gate.leave()
    gate.hold(timeout=1)
    assert gate.held
    gate.release()
    assert not gate.held


def test_the_gate_over_http_holds_calls_and_stamps_the_released_version(tmp_path, tokenizer):
    """`POST /weights/hold` and `/weights/release` (a trainer in another process): a call
    made while held waits, and is sampled as the version named on release; bad bodies are
    refused in the OpenAI error shape."""
    engine = ScriptedEngine(tokenizer, replay(["done"]))
    engine.weight_version = "v1"
    served = ServedProxy(make_proxy(engine, tmp_path))
    with served.running():
        key = served.new_rollout()["key"]
        held = httpx.post(f"{served.url}/weights/hold", json={"timeout": 30}, timeout=60)
        assert held.status_code == 200 and served.proxy.gate.held
        result: dict[str, httpx.Response] = {}
        call = threading.Thread(target=lambda: result.update(r=_chat(served.url, key, False)))
        call.start()
        deadline = time.monotonic() + 60
        while served.proxy.gate.waiting < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # the call reached the proxy and is held
        assert call.is_alive() and served.proxy.gate.waiting == 1
        released = httpx.post(f"{served.url}/weights/release", json={"version": "v2"})
        assert released.json() == {"held": False, "weight_version": "v2"}
        call.join(30)
        assert result["r"].status_code == 200
        [turn] = served.store.turns(key)
        assert turn.weight_version == "v2"
        bad = httpx.post(f"{served.url}/weights/hold", json={"timeout": "soon"})
        assert bad.status_code == 400 and "timeout" in bad.json()["error"]["message"]
        assert not served.proxy.gate.held


def test_the_paused_clock_runs_while_the_gate_is_held_or_closed():
    """What agent timeouts leave out: the seconds new calls were withheld, by a swap's
    hold or a colocated step's close, overlapping or not, and nothing while open."""
    gate = WeightGate()
    time.sleep(0.05)
    assert gate.paused_seconds() == 0.0  # open: the clock stands
    gate.close()
    time.sleep(0.1)
    gate.hold(timeout=1)  # a swap inside the step: one pause, not two
    running = gate.paused_seconds()
    assert running >= 0.1
    time.sleep(0.1)
    gate.release()
    assert gate.paused_seconds() > running  # still closed: still running
    gate.open()
    stopped = gate.paused_seconds()
    assert 0.2 <= stopped < 1.0
    time.sleep(0.1)
    assert gate.paused_seconds() == stopped


def test_a_deadline_moves_on_by_the_paused_seconds():
    """`finished_within`: a wait that would time out finishes when the paused clock
    advanced meanwhile by as much as it overran, and times out without it."""
    import asyncio

    from harnessrl.rollout.sandbox.base import finished_within

    async def within(paused_by: float) -> bool:
        started = time.monotonic()
        task = asyncio.ensure_future(asyncio.sleep(0.6))
        # the clock advances with wall time for its first `paused_by` seconds
        clock = (lambda: min(time.monotonic() - started, paused_by)) if paused_by else None
        try:
            return await finished_within(task, 0.3, clock)
        finally:
            task.cancel()

    assert asyncio.run(within(0.0)) is False  # 0.3 s of 0.6: out of time
    assert asyncio.run(within(0.5)) is True  # 0.3 s + 0.5 paused: it finished at 0.6
