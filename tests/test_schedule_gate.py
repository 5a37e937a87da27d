"""The colocated schedule at the proxy's gate: during a step, a call already streaming
finishes, a new call is held (the client waits: no timeout, no error, no retry) through
the step and the weight sync inside it, and is sampled after the step by the new weights.

The engine is the scripted one (named as such), slowed per token so a stream is still
running when the step starts; the held client is the official `openai` SDK."""

from __future__ import annotations

import threading
import time

import httpx
import openai
from openai.types.chat import ChatCompletion

from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
from harnessrl.train.async_grpo.schedule import Schedule
from tests.helpers import ServedProxy, make_proxy


def _wait(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def test_a_step_holds_new_calls_lets_running_ones_finish_and_releases_after_the_sync(
        tmp_path, tokenizer):
    engine = ScriptedEngine(tokenizer, replay(["word " * 40]), token_delay=0.02)
    engine.weight_version = "v1"
    served = ServedProxy(make_proxy(engine, tmp_path))
    gate = served.proxy.gate
    schedule = Schedule(colocated=True, step_groups=2, steps=1, gates=[gate])
    results: dict[str, object] = {}

    def stream(key: str) -> None:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}],
                "stream": True}
        results["running"] = httpx.post(f"{served.url}/r/{key}/v1/chat/completions",
                                        json=body, timeout=60)

    def held_call(key: str) -> None:
        client = openai.OpenAI(base_url=f"{served.url}/r/{key}/v1", api_key="k",
                               max_retries=0)  # a retry would hide an error
        try:
            results["held"] = client.chat.completions.create(
                model="scripted", messages=[{"role": "user", "content": "go on"}])
        except Exception as error:  # the assertion below names it
            results["held"] = error
        results["held_at"] = time.monotonic()

    with served.running():
        key = served.new_rollout()["key"]
        running = threading.Thread(target=stream, args=(key,))
        running.start()
        _wait(lambda: gate.inflight == 1)  # the stream is in the engine (~0.8 s of tokens)
        schedule.step_begin(1)  # returns at once: the running stream is not waited for
        assert gate.closed and gate.inflight == 1 and schedule.label() == "training step 1"
        other = served.new_rollout()["key"]
        waiting = threading.Thread(target=held_call, args=(other,))
        waiting.start()
        _wait(lambda: gate.waiting == 1)  # the harness's call reached the proxy: held
        running.join(30)  # the stream finished while the gate stayed closed
        assert isinstance(results["running"], httpx.Response)
        assert results["running"].status_code == 200
        time.sleep(0.5)
        assert waiting.is_alive() and "held" not in results
        # the weight sync inside the step: it holds (nothing runs now) and releases with
        # the new version; the step's gate stays closed
        schedule.syncing()
        gate.hold(timeout=30)
        engine.weight_version = "v2"
        gate.release()
        time.sleep(0.3)
        assert waiting.is_alive() and gate.waiting == 1
        opened = time.monotonic()
        schedule.step_end()
        waiting.join(60)
        assert not waiting.is_alive()
        first = served.store.turns(key)
        second = served.store.turns(other)

    held = results["held"]
    assert isinstance(held, ChatCompletion), held
    assert held.choices[0].message.content and results["held_at"] >= opened  # type: ignore[operator]
    assert [t.weight_version for t in first] == ["v1"]  # sampled before the step
    # the held call is stored once, sampled by the weights the step produced
    assert [(t.status, t.weight_version) for t in second] == [("ok", "v2")]
    assert len(gate.waits) == 1 and gate.waits[0] > 0.8
    assert not gate.closed and schedule.label() == "sampling"


def test_the_step_over_http_closes_and_opens_the_gate(tmp_path, tokenizer):
    """`POST /weights/close` and `/weights/open` (a trainer in another process): a call
    made while closed waits until open; both take no body fields."""
    engine = ScriptedEngine(tokenizer, replay(["done"]))
    served = ServedProxy(make_proxy(engine, tmp_path))
    with served.running():
        key = served.new_rollout()["key"]
        closed = httpx.post(f"{served.url}/weights/close", json={})
        assert closed.status_code == 200 and served.proxy.gate.closed
        result: dict[str, httpx.Response] = {}
        body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
        call = threading.Thread(target=lambda: result.update(r=httpx.post(
            f"{served.url}/r/{key}/v1/chat/completions", json=body, timeout=60)))
        call.start()
        _wait(lambda: served.proxy.gate.waiting == 1)
        assert call.is_alive()
        opened = httpx.post(f"{served.url}/weights/open")
        assert opened.status_code == 200 and not served.proxy.gate.closed
        call.join(30)
        assert result["r"].status_code == 200
        bad = httpx.post(f"{served.url}/weights/close", json={"when": "now"})
        assert bad.status_code == 400 and "when" in bad.json()["error"]["message"]
        assert not served.proxy.gate.closed
