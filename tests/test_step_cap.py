"""The step cap (`max_model_calls`) in the proxy, in every dialect, with the scripted engine
(issue 15, item 6): the call over the cap is refused in the dialect's own error shape (its
official SDK raises its normal error), is recorded as a failed `step_cap` turn with nothing
sampled, and never reaches the engine; the server default, the per-rollout value, a
restart, and bad values refused with the field named."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest

from harnessrl.proxy.app import Proxy
from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
from harnessrl.proxy.sessions import Sessions
from harnessrl.rollout.analysis.chains import link, rollout_stats
from harnessrl.store.writer import TraceStore
from tests.dialects import IDS, WIRE, WireDialect
from tests.helpers import ServedProxy

# The error type (Gemini: status) each dialect answers a call over the cap with, at 400.
CAP_TYPES = {"openai_chat": "invalid_request_error", "openai_responses": "invalid_request_error",
             "anthropic": "invalid_request_error", "gemini": "FAILED_PRECONDITION"}


@pytest.fixture
def engine(tokenizer) -> ScriptedEngine:
    return ScriptedEngine(tokenizer, replay(["Hello!"]), model="scripted")  # counts `calls`


@contextlib.contextmanager
def serve(engine, run_dir: Path, default: int | None = None) -> Iterator[ServedProxy]:
    sessions = Sessions(TraceStore(run_dir), max_model_calls=default)
    with ServedProxy(Proxy(engine, sessions)).running() as served:
        yield served


def rollout(served: ServedProxy, **options) -> ServedProxy:
    created = served.new_rollout(**options)
    served.key, served.root = created["key"], created["base_url"]  # type: ignore[attr-defined]
    served.cap = created["max_model_calls"]  # type: ignore[attr-defined]
    return served


@pytest.mark.parametrize("dialect", WIRE, ids=IDS)
def test_the_call_over_the_cap_is_refused_in_the_dialects_shape(engine, tmp_path,
                                                                 dialect: WireDialect) -> None:
    with serve(engine, tmp_path / "run") as served:
        rollout(served, max_model_calls=2)
        assert served.cap == 2  # type: ignore[attr-defined]
        assert dialect.post(served).status_code == 200
        assert dialect.post(served, stream=True).status_code == 200  # streamed calls count
        assert engine.calls == 2

        resp = dialect.post(served)
        assert resp.status_code == 400, resp.text
        error = dialect.error(resp.status_code, resp.json())
        assert dialect.error_type(error) == CAP_TYPES[dialect.name]
        assert "max_model_calls = 2" in error["message"] and "not sent" in error["message"]
        if dialect.name.startswith("openai"):
            assert error["code"] == "max_model_calls_exceeded"
        # Streamed too: a plain HTTP error before any event, not a stream that breaks.
        streamed = dialect.post(served, stream=True)
        assert streamed.status_code == 400 and dialect.shape(400, streamed.json())

        with pytest.raises(dialect.sdk_error) as caught:  # the SDK's own error, no retry
            dialect.sdk(served, False)
        code = getattr(caught.value, "status_code", None) or getattr(caught.value, "code", None)
        assert code == 400 and "max_model_calls" in str(caught.value)
        assert engine.calls == 2  # nothing over the cap reached the engine

        turns = served.store.turns(served.key)  # type: ignore[attr-defined]
    assert [t.status for t in turns] == ["ok", "ok", "failed", "failed", "failed"]
    for turn in turns[2:]:
        assert turn.error_kind == "step_cap" and turn.error.startswith("step_cap: ")
        assert turn.completion is None and turn.request is None  # nothing invented
        assert turn.raw_request and dialect.shape(400, msgspec.json.decode(turn.raw_response))
        assert turn.dialect == dialect.name
    linked = link(turns)
    assert [len(c.turns) for c in linked.chains] == [1, 1]
    assert [(e.turn, e.reason) for e in linked.excluded] == [(2, "failed"), (3, "failed"),
                                                             (4, "failed")]
    assert rollout_stats(turns).capped == 1


def test_the_server_default_applies_unless_the_rollout_sets_its_own(engine, tmp_path) -> None:
    chat = WIRE[0]
    with serve(engine, tmp_path / "run", default=1) as served:
        first = rollout(served)
        assert first.cap == 1  # type: ignore[attr-defined]
        assert chat.post(served).status_code == 200
        assert chat.post(served).status_code == 400
        rollout(served, max_model_calls=3)
        assert [chat.post(served).status_code for _ in range(4)] == [200, 200, 200, 400]
    with serve(engine, tmp_path / "other") as served:  # no default: no cap
        rollout(served)
        assert served.cap is None  # type: ignore[attr-defined]
        assert [chat.post(served).status_code for _ in range(5)] == [200] * 5


def test_calls_refused_for_their_input_count_and_list_calls_do_not(engine, tmp_path) -> None:
    chat = WIRE[0]
    with serve(engine, tmp_path / "run") as served:
        rollout(served, max_model_calls=2)
        assert httpx.get(f"{served.root}/v1/models").status_code == 200  # type: ignore[attr-defined]
        bad = httpx.post(f"{served.root}/v1/chat/completions",  # type: ignore[attr-defined]
                         json={"model": "m", "messages": "not a list"})
        assert bad.status_code == 400 and "max_model_calls" not in bad.text
        assert chat.post(served).status_code == 200
        resp = chat.post(served)
        assert resp.status_code == 400 and "max_model_calls" in resp.text
        kinds = [t.error_kind for t in served.store.turns(served.key)]  # type: ignore[attr-defined]
    assert kinds == ["invalid_request", None, "step_cap"]


def test_the_count_survives_a_restart(engine, tmp_path) -> None:
    chat = WIRE[0]
    with serve(engine, tmp_path / "run") as served:
        rollout(served, max_model_calls=2)
        assert chat.post(served).status_code == 200
        key = served.key  # type: ignore[attr-defined]
    with serve(engine, tmp_path / "run") as served:  # a new proxy on the same store
        served.root = f"{served.url}/r/{key}"  # type: ignore[attr-defined]
        assert [chat.post(served).status_code for _ in range(3)] == [200, 400, 400]
        assert served.store.rollout(key).max_model_calls == 2
        assert served.store.model_calls(key) == 2


def test_calls_arriving_together_cannot_both_take_the_last_one(tokenizer, tmp_path) -> None:
    slow = ScriptedEngine(tokenizer, replay(["Hello there, a slow reply."]), token_delay=0.02)
    chat = WIRE[0]
    with serve(slow, tmp_path / "run") as served:
        rollout(served, max_model_calls=3)
        codes: list[int] = []
        threads = [threading.Thread(target=lambda: codes.append(chat.post(served).status_code))
                   for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sorted(codes) == [200, 200, 200, 400, 400, 400] and slow.calls == 3


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("value", ["0", "-1", str(2**63), "-" + "9" * 30, "9" * 5000],
                         ids=["zero", "negative", "past-int64", "very-negative", "huge"])
def test_a_cap_below_one_or_out_of_range_is_refused_with_the_field_named(engine, tmp_path,
                                                                         value) -> None:
    with serve(engine, tmp_path / "run") as served:
        resp = httpx.post(f"{served.url}/rollouts", content=f'{{"max_model_calls": {value}}}',
                          headers={"content-type": "application/json"})
        count = sum(1 for _ in served.store.iter_rollouts())
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "max_model_calls" and "max_model_calls" in error["message"]
    assert count == 0  # no rollout was made


@pytest.mark.parametrize("value", ['"3"', "2.5", "true", "null"])
def test_a_cap_that_is_not_an_integer_is_refused(engine, tmp_path, value) -> None:
    with serve(engine, tmp_path / "run") as served:
        resp = httpx.post(f"{served.url}/rollouts", content=f'{{"max_model_calls": {value}}}',
                          headers={"content-type": "application/json"})
    if value == "null":  # null is "not given": the server's default (none here)
        assert resp.status_code == 201 and resp.json()["max_model_calls"] is None
        return
    error = resp.json()["error"]
    assert resp.status_code == 400 and error["param"] == "max_model_calls", error


def test_a_server_default_below_one_is_refused(tmp_path) -> None:
    with TraceStore(tmp_path) as store, pytest.raises(ValueError, match="max_model_calls"):
        Sessions(store, max_model_calls=0)


def test_the_command_line_and_the_train_config_refuse_a_cap_below_one(tmp_path, capsys) -> None:
    from harnessrl.cli import main
    from harnessrl.train.config import ConfigError, load_config

    for argv in (["serve", "--scripted", "x", "--max-model-calls", "0"],
                 ["run", "--harness", "aider", "--tasks", "bundled", "--oracle",
                  "--max-model-calls", "-2"],
                 ["run", "--harness", "aider", "--tasks", "bundled", "--oracle",
                  "--tool-call-budget", "0"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        assert argv[-2] in capsys.readouterr().err  # the flag is named
    config = tmp_path / "train.toml"
    config.write_text("[rollout]\nmax_model_calls = 0\n")
    with pytest.raises(ConfigError, match=r"rollout\.max_model_calls"):
        load_config(config)
    config.write_text("[shaping]\ntool_call_budget = 0\n")
    with pytest.raises(ConfigError, match=r"shaping\.tool_call_budget"):
        load_config(config)
    config.write_text("[rollout]\nmax_model_calls = 7\n[shaping]\ntool_call_bonus = 0.5\n")
    loaded = load_config(config)
    assert loaded.rollout.max_model_calls == 7 and loaded.shaping.tool_call_bonus == 0.5


def test_the_runner_asks_for_its_cap_when_it_opens_a_rollout(engine, tmp_path) -> None:
    from harnessrl.rollout.runner import open_rollout

    with serve(engine, tmp_path / "run", default=9) as served:
        capped = asyncio.run(open_rollout(served.url, {}, max_model_calls=4))
        default = asyncio.run(open_rollout(served.url, {}))
        assert served.store.rollout(capped["key"]).max_model_calls == 4
        assert served.store.rollout(default["key"]).max_model_calls == 9


def test_a_refused_call_commits_its_own_turn_only_when_no_call_is_in_flight(
        engine, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call refused before the gate does not count itself in flight: with one other call
    running, its turn goes through the writer's queue, as that call's will."""
    chat = WIRE[0]
    with serve(engine, tmp_path / "run") as served:
        rollout(served)
        seen: list[tuple[str, bool]] = []
        add_turn = served.store.add_turn

        async def spy(turn, *, alone: bool = False) -> None:
            seen.append((turn.status, alone))
            await add_turn(turn, alone=alone)

        monkeypatch.setattr(served.store, "add_turn", spy)
        url = f"{served.root}/v1/chat/completions"  # type: ignore[attr-defined]
        bad = {"model": "m", "messages": "not a list"}
        assert httpx.post(url, json=bad).status_code == 400
        assert chat.post(served).status_code == 200  # admitted: it counts itself
        monkeypatch.setattr(type(served.proxy.gate), "inflight", property(lambda _self: 1))
        assert httpx.post(url, json=bad).status_code == 400  # one other call in flight
    assert seen == [("failed", True), ("ok", True), ("failed", False)]
