"""Regressions for the defects adversarial input found (issue 13): each answered a bare 500
or lost the call before it was fixed. Every answer here is a 4xx (or the engine's 502) in
the caller's own error shape, and every call is in the store."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
from harnessrl.proxy.engines.vllm import VLLMEngine
from harnessrl.proxy.serve import in_thread
from harnessrl.proxy.wire.nesting import MAX_DEPTH
from harnessrl.types import Chunk, EngineEvent, Finished, Started
from tests.conftest import ServedProxy, make_proxy
from tests.fake_vllm import FakeVLLM

CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {
    "name": "bash", "parameters": {"type": "object",
                                   "properties": {"command": {"type": "string"}}}}}]


def nested_text(depth: int) -> str:
    return "[" * depth + "]" * depth


def openai_error(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.fixture
def scripted(tokenizer, tmp_path: Path) -> Iterator[ServedProxy]:
    engine = ScriptedEngine(tokenizer, replay([CALL]), model="scripted")
    with ServedProxy(make_proxy(engine, tmp_path / "run")).running() as served:
        yield served


# ------------------------------------------------------------------ 1: nested arguments text
def _issued_call(served: ServedProxy, root: str) -> str:
    """Has the proxy issue one tool call in this rollout; its id."""
    resp = httpx.post(f"{root}/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "go"}], "tools": TOOLS})
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["message"]["tool_calls"][0]["id"]


def _chat_history(call_id: str, arguments: str) -> dict[str, Any]:
    return {"model": "m", "tools": TOOLS, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "bash", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "out"}]}


def _responses_history(call_id: str, arguments: str) -> dict[str, Any]:
    return {"model": "m", "store": False, "tools": [
        {"type": "function", "name": "bash", "parameters": TOOLS[0]["function"]["parameters"]}],
        "input": [{"type": "message", "role": "user", "content": "go"},
                  {"type": "function_call", "call_id": call_id, "name": "bash",
                   "arguments": arguments},
                  {"type": "function_call_output", "call_id": call_id, "output": "out"}]}


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 990, 5000])
@pytest.mark.parametrize(("path", "history"), [("/v1/chat/completions", _chat_history),
                                               ("/v1/responses", _responses_history)],
                         ids=["openai_chat", "openai_responses"])
def test_resent_call_with_deeply_nested_arguments_is_a_recorded_400(scripted, path, history,
                                                                    depth) -> None:
    rollout = scripted.new_rollout()
    call_id = _issued_call(scripted, rollout["base_url"])
    resp = httpx.post(f"{rollout['base_url']}{path}",
                      json=history(call_id, nested_text(depth)))
    error = openai_error(resp, 400)
    assert error["type"] == "invalid_request_error" and "nested" in error["message"]
    turns = scripted.store.turns(rollout["key"])
    assert len(turns) == 2 and turns[-1].status == "failed"
    assert turns[-1].error.startswith("invalid_request: ")


def test_resent_call_nested_up_to_the_limit_is_served(scripted) -> None:
    rollout = scripted.new_rollout()
    call_id = _issued_call(scripted, rollout["base_url"])
    resp = httpx.post(f"{rollout['base_url']}/v1/chat/completions",
                      json=_chat_history(call_id, nested_text(MAX_DEPTH)))
    assert resp.status_code == 200, resp.text
    assert [t.status for t in scripted.store.turns(rollout["key"])] == ["ok", "ok"]


# ------------------------------------------------------------------ 2: token ids past int32
class WideIdVLLM(FakeVLLM):
    """FakeVLLM that samples one token id that does not fit in 32 bits."""

    wide = 2**31

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        ids = [10, self.wide]
        logprobs = {"content": [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -1}]}
        if not body.get("stream"):
            return JSONResponse({
                "model": "fake", "prompt_token_ids": [1, 2],
                "choices": [{"finish_reason": "stop", "token_ids": ids, "logprobs": logprobs,
                             "message": {"role": "assistant", "content": "ab"}}]})

        async def stream():
            head = {"model": "fake", "prompt_token_ids": [1, 2]}
            for i, token in enumerate(ids):
                choice = {"delta": {"content": "ab"[i]}, "token_ids": [token],
                          "finish_reason": "stop" if i else None,
                          "logprobs": {"content": [logprobs["content"][i]]}}
                yield f"data: {json.dumps({**head, 'choices': [choice]})}\n\n".encode()
            yield b"data: [DONE]\n\n"
        return StreamingResponse(stream(), media_type="text/event-stream")


@pytest.fixture
def wide(tmp_path: Path) -> Iterator[ServedProxy]:
    fake = WideIdVLLM()
    with in_thread(fake.app()) as (url, _server):
        proxy = make_proxy(VLLMEngine(url, read_timeout=10), tmp_path / "run")
        with ServedProxy(proxy).running() as served:
            yield served


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_token_id_past_int32_from_the_engine_fails_the_call_and_records_it(wide, stream
                                                                           ) -> None:
    rollout = wide.new_rollout()
    url = f"{rollout['base_urls']['openai']}/chat/completions"
    for _ in range(3):
        resp = httpx.post(url, json={"model": "m", "stream": stream,
                                     "messages": [{"role": "user", "content": "hi"}]})
        if resp.status_code == 200:  # streamed, failing after the stream opened
            assert stream and b'data: {"error":' in resp.content, resp.text
            assert b"2147483647" in resp.content  # the bound the id broke
        else:  # or before: the two chunks can arrive in one read
            error = openai_error(resp, 502)
            assert "2147483647" in error["message"], error
    turns = wide.store.turns(rollout["key"])
    assert [t.status for t in turns] == ["failed"] * 3
    assert all(t.error.startswith("engine_error: ") for t in turns), turns[0].error


class WideIdEngine(ScriptedEngine):
    """An engine that hands the proxy an id the store cannot pack, past any engine check:
    the store's own refusal must still leave a failed turn behind, not a lost call."""

    async def complete(self, request, rollout=None) -> list[EngineEvent]:
        return [e async for e in self.stream(request)]

    async def stream(self, request, rollout=None  # type: ignore[override]
                     ) -> AsyncGenerator[EngineEvent, None]:
        yield Started(self.model, (1, 2))
        yield Chunk((), (2**40,), (-0.5,))
        yield Finished("stop", None)


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_a_turn_the_store_cannot_pack_is_recorded_as_failed(tokenizer, tmp_path, stream
                                                            ) -> None:
    engine = WideIdEngine(tokenizer, replay(["x"]))
    with ServedProxy(make_proxy(engine, tmp_path / "run")).running() as served:
        rollout = served.new_rollout()
        resp = httpx.post(f"{rollout['base_urls']['openai']}/chat/completions", json={
            "model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
        if not stream:
            assert resp.status_code == 500, resp.text
            openai_error(resp, 500)
        [turn] = served.store.turns(rollout["key"])
        assert turn.status == "failed" and "cannot pack" in turn.error, turn.error
        assert turn.completion is not None and turn.completion.tokens.completion_ids is None
        assert "tokens_not_stored" in turn.flags


# ------------------------------------------------------------------ 3: out-of-range paging
@pytest.mark.parametrize("query", [
    {"limit": "99999999999999999999"}, {"offset": "99999999999999999999"},
    {"limit": str(2**63)}, {"offset": str(2**63)}, {"offset": "-1"}, {"limit": "-5"},
    {"limit": "100001"}, {"limit": "x"}])
def test_out_of_range_paging_is_a_400_in_shape(scripted, query) -> None:
    rollout = scripted.new_rollout()
    resp = httpx.get(f"{scripted.url}/rollouts/{rollout['key']}", params=query,
                     headers={"Authorization": f"Bearer {rollout['key']}"})
    error = openai_error(resp, 400)
    assert error["param"] in ("offset", "limit"), error


def test_paging_within_range_is_served(scripted) -> None:
    rollout = scripted.new_rollout()
    _issued_call(scripted, rollout["base_url"])
    headers = {"Authorization": f"Bearer {rollout['key']}"}
    for query, count in [({"offset": str(2**63 - 1)}, 0), ({"limit": "0"}, 0),
                         ({"limit": "1000"}, 1), ({}, 1)]:
        resp = httpx.get(f"{scripted.url}/rollouts/{rollout['key']}", params=query,
                         headers=headers)
        assert resp.status_code == 200, (query, resp.text)
        assert len(resp.json()["turns"]) == count, query


# ------------------------------------------------------------------ 4: nested metadata
def _nested_object(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 980, 1100, 50_000])
def test_deeply_nested_rollout_metadata_is_a_400_in_shape(scripted, depth) -> None:
    raw = b'{"metadata": ' + _nested_object(depth) + b"}"
    resp = httpx.post(f"{scripted.url}/rollouts", content=raw)
    error = openai_error(resp, 400)
    assert "nested" in error["message"], error


def test_rollout_metadata_within_the_limit_is_kept_and_read_back(scripted) -> None:
    depth = MAX_DEPTH
    raw = b'{"metadata": ' + _nested_object(depth) + b"}"
    resp = httpx.post(f"{scripted.url}/rollouts", content=raw)
    assert resp.status_code == 201, resp.text
    key = resp.json()["key"]
    got = httpx.get(f"{scripted.url}/rollouts/{key}", headers={"Authorization": f"Bearer {key}"})
    assert got.status_code == 200, got.text
    assert json.dumps(got.json()["rollout"]["metadata"]).count("{") == depth
