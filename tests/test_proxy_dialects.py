"""All four dialects through the proxy against the scripted engine: the official SDKs as
clients, conversations replayed as harnesses send them back, and errors in each shape."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
from tests.dialects import IDS, WIRE, WireDialect
from tests.helpers import (
    REPLIES,
    SCHEMA,
    ServedProxy,
    call,
    make_proxy,
)


@pytest.fixture
def engine(tokenizer) -> ScriptedEngine:
    return ScriptedEngine(tokenizer, replay(REPLIES), model="scripted")


@pytest.fixture
def served(engine: ScriptedEngine, tmp_path: Path):
    with ServedProxy(make_proxy(engine, tmp_path / "run")).running() as served:
        rollout = served.new_rollout()
        served.key, served.root = rollout["key"], rollout["base_url"]
        yield served


# ------------------------------------------------------------------ harness-like drivers


def post(served, path: str, body: Any, key: str | None = None, **kwargs) -> httpx.Response:
    key = key or served.key
    headers = {"x-api-key": key, "x-goog-api-key": key, "authorization": f"Bearer {key}"}
    return httpx.post(f"{served.url}{path}", json=body, headers=headers, timeout=30, **kwargs)


@pytest.mark.parametrize("dialect", WIRE, ids=IDS)
def test_three_turns_extend_token_for_token(served, dialect: WireDialect) -> None:
    driver = dialect.driver
    history = driver.start()
    for _ in REPLIES:
        resp = post(served, driver.path, driver.body(history))
        assert resp.status_code == 200, resp.text
        history = driver.extend(history, resp.json())
    turns = served.store.turns(served.key)
    assert [t.dialect for t in turns] == [dialect.name] * 3
    assert [t.completion.finish_reason for t in turns] == ["tool_calls", "tool_calls", "stop"]
    for before, after in itertools.pairwise(turns):
        prefix = before.completion.tokens.prompt_ids + before.completion.tokens.completion_ids
        assert after.completion.tokens.prompt_ids[: len(prefix)] == prefix


@pytest.mark.parametrize(("path", "check"), [
    ("/v1/chat/completions", lambda b: b["error"]["type"] == "authentication_error"),
    ("/v1/messages", lambda b: b["type"] == "error"
     and b["error"]["type"] == "authentication_error"),
    ("/v1/responses", lambda b: b["error"]["type"] == "authentication_error"),
    ("/v1beta/models/g:generateContent", lambda b: b["error"]["status"] == "UNAUTHENTICATED"),
])
def test_unknown_key_answers_401_in_each_shape(served, path, check) -> None:
    resp = post(served, path, {}, key="hrl-wrong")
    assert resp.status_code == 401 and check(resp.json())


@pytest.mark.parametrize("dialect", WIRE, ids=IDS)
def test_tool_result_for_a_call_never_made_is_a_400(served, dialect: WireDialect) -> None:
    driver = dialect.driver
    history = driver.extend(driver.start(), {
        "choices": [{"message": {"role": "assistant", "content": "x"}}],
        "content": [{"type": "text", "text": "x"}], "output": [],
        "candidates": [{"content": {"role": "model", "parts": [{"text": "x"}]}}]})
    orphan = {
        "openai_chat": {"role": "tool", "tool_call_id": "call_nope", "content": "ok"},
        "anthropic": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_nope", "content": "ok"}]},
        "openai_responses": {"type": "function_call_output", "call_id": "call_nope",
                             "output": "ok"},
        "gemini": {"role": "user", "parts": [{"functionResponse": {
            "name": "bash", "id": "nope", "response": {}}}]},
    }[dialect.name]
    resp = post(served, driver.path, driver.body([*history, orphan]))
    assert resp.status_code == 400, resp.text
    assert "nope" in resp.text
    assert served.store.turns(served.key)[-1].status == "failed"


def test_anthropic_count_tokens_is_the_engine_count(served, engine) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=served.root, api_key=served.key, max_retries=0)
    counted = client.messages.count_tokens(
        model="claude", messages=[{"role": "user", "content": "count me"}], system="sys")
    from harnessrl.proxy.dialects import anthropic as dialect

    expected = engine.render_prompt(dialect.parse_count_tokens(
        {"messages": [{"role": "user", "content": "count me"}], "system": "sys"}))
    assert counted.input_tokens == len(expected) > 5
    assert served.store.turns(served.key) == []  # counting is not a model call


def test_gemini_sdk_generate_stream_and_count(served, engine) -> None:
    from google import genai
    from google.genai import types

    engine.policy = replay(["Hello from Gemini land.", call("bash", {"command": "ls"})])
    client = genai.Client(api_key=served.key,
                          http_options=types.HttpOptions(base_url=served.root))
    reply = client.models.generate_content(model="gemini-x", contents="hi")
    assert reply.text == "Hello from Gemini land."
    tool = types.Tool(function_declarations=[types.FunctionDeclaration(
        name="bash", parameters_json_schema=SCHEMA)])
    chunks = list(client.models.generate_content_stream(
        model="gemini-x", contents="list", config=types.GenerateContentConfig(tools=[tool])))
    calls = [p.function_call for c in chunks for p in c.candidates[0].content.parts or []
             if p.function_call]
    assert [(c.name, c.args) for c in calls] == [("bash", {"command": "ls"})]
    counted = client.models.count_tokens(model="gemini-x", contents="hi")
    assert counted.total_tokens > 0
    first, second = served.store.turns(served.key)
    assert first.dialect == second.dialect == "gemini"
    assert b"data: " in second.raw_response  # streamed with alt=sse


def test_gemini_stream_without_alt_sse_is_a_json_array(served, engine) -> None:
    engine.policy = replay(["array form"])
    resp = post(served, "/v1beta/models/g:streamGenerateContent", {
        "contents": [{"role": "user", "parts": [{"text": "x"}]}]})
    chunks = json.loads(resp.content)
    assert isinstance(chunks, list)
    text = "".join(p.get("text", "") for c in chunks for p in c["candidates"][0]["content"][
        "parts"]) if chunks else ""
    assert text == "array form"


def test_previous_response_id_chains_and_extends(served, engine) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{served.root}/v1", api_key=served.key, max_retries=0)
    tools = [{"type": "function", "name": "bash", "parameters": SCHEMA}]
    first = client.responses.create(model="codex", input="make hello.txt", tools=tools)
    [fc] = [i for i in first.output if i.type == "function_call"]
    second = client.responses.create(
        model="codex", previous_response_id=first.id, tools=tools,
        input=[{"type": "function_call_output", "call_id": fc.call_id, "output": "ok"}])
    assert second.status == "completed"
    one, two = served.store.turns(served.key)
    prefix = one.completion.tokens.prompt_ids + one.completion.tokens.completion_ids
    assert two.completion.tokens.prompt_ids[: len(prefix)] == prefix
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="codex", previous_response_id="resp_unknown",
                                input="again")


def test_models_are_listed_in_the_asking_clients_shape(served) -> None:
    url = f"{served.url}/v1/models"
    openai_list = httpx.get(url, headers={"authorization": f"Bearer {served.key}"}).json()
    claude_list = httpx.get(url, headers={"x-api-key": served.key,
                                          "anthropic-version": "2023-06-01"}).json()
    gemini_list = httpx.get(f"{served.url}/v1beta/models",
                            headers={"x-goog-api-key": served.key}).json()
    assert openai_list["data"][0]["id"] == "scripted" and openai_list["object"] == "list"
    assert claude_list["data"][0] == {**claude_list["data"][0], "type": "model",
                                      "id": "scripted"}
    assert gemini_list["models"][0]["name"] == "models/scripted"


SHAPES = {
    "/v1/chat/completions": lambda b: b["error"]["type"] == "invalid_request_error",
    "/v1/messages": lambda b: b["type"] == "error"
    and b["error"]["type"] == "invalid_request_error",
    "/v1/responses": lambda b: b["error"]["type"] == "invalid_request_error",
    "/v1beta/models/g:generateContent": lambda b: b["error"]["status"] == "INVALID_ARGUMENT",
}
EMPTY = {"/v1/chat/completions": {"model": "m", "messages": []},
         "/v1/messages": {"model": "m", "max_tokens": 5, "messages": []},
         "/v1/responses": {"model": "m", "input": []},
         "/v1beta/models/g:generateContent": {"contents": []}}


@pytest.mark.parametrize("path", list(SHAPES))
@pytest.mark.parametrize("kind", ["malformed", "empty", "wrong_type"])
def test_bad_input_is_a_400_in_each_shape_and_recorded(served, path, kind) -> None:
    key = served.key
    headers = {"x-api-key": key, "x-goog-api-key": key, "authorization": f"Bearer {key}",
               "content-type": "application/json"}
    body = {"malformed": b'{"model": ', "empty": json.dumps(EMPTY[path]).encode(),
            "wrong_type": b'{"model": "m", "messages": 3, "input": 3, "contents": 3,'
                          b' "max_tokens": 5}'}[kind]
    resp = httpx.post(f"{served.url}{path}", content=body, headers=headers)
    assert resp.status_code == 400, resp.text
    assert SHAPES[path](resp.json())
    [turn] = served.store.turns(key)
    assert turn.status == "failed" and turn.raw_request == body
    assert post(served, path, {}).status_code == 400  # and the proxy still serves
