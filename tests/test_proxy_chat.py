"""The proxy end to end with the official `openai` SDK against the scripted engine."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import openai
import pytest

from harnessrl.proxy.engines.scripted import Reply, ScriptedEngine, default_logprob, replay
from tests.helpers import ServedProxy, make_proxy

TOOLS = [{
    "type": "function",
    "function": {"name": "bash", "description": "Run a shell command",
                 "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                "required": ["command"]}},
}]
CALL_TEXT = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
TWO_CALLS = CALL_TEXT + '\n<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}' \
    '\n</tool_call>'


@pytest.fixture
def engine(tokenizer) -> ScriptedEngine:
    return ScriptedEngine(tokenizer, replay(["Hello there!"]), model="scripted")


@pytest.fixture
def served(engine: ScriptedEngine, tmp_path: Path):
    with ServedProxy(make_proxy(engine, tmp_path / "run")).running() as served:
        yield served


def client_for(served: ServedProxy, **rollout_options) -> tuple[openai.OpenAI, str]:
    rollout = served.new_rollout(**rollout_options)
    client = openai.OpenAI(base_url=rollout["base_urls"]["openai"], api_key=rollout["key"],
                           max_retries=0)
    return client, rollout["key"]


def expected_ids(tokenizer, text: str) -> list[int]:
    return [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]


def test_non_streamed_reply_and_exact_tokens(served, engine, tokenizer) -> None:
    client, key = client_for(served)
    reply = client.chat.completions.create(
        model="any-name-the-harness-likes",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert reply.choices[0].message.content == "Hello there!"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == "any-name-the-harness-likes"

    [turn] = served.store.turns(key)
    ids = expected_ids(tokenizer, "Hello there!")
    assert turn.status == "ok" and turn.flags == ()
    assert list(turn.completion.tokens.completion_ids) == ids
    assert list(turn.completion.tokens.logprobs) == [default_logprob(i) for i in range(len(ids))]
    prompt = engine.render_prompt(turn.request)
    assert list(turn.completion.tokens.prompt_ids) == prompt
    assert reply.usage.prompt_tokens == len(prompt)
    assert json.loads(turn.raw_response)["choices"][0]["message"]["content"] == "Hello there!"
    assert json.loads(turn.raw_request)["model"] == "any-name-the-harness-likes"
    assert turn.dialect == "openai_chat" and turn.model == "scripted"


def test_streamed_reply_arrives_in_chunks_with_usage(served, engine, tokenizer) -> None:
    engine.policy = replay(["Streaming works token by token."])
    client, key = client_for(served)
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "go"}], stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Streaming works token by token."
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 3
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(
        expected_ids(tokenizer, text))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"

    [turn] = served.store.turns(key)
    assert list(turn.completion.tokens.completion_ids) == expected_ids(tokenizer, text)
    assert turn.raw_response.endswith(b"data: [DONE]\n\n")
    assert turn.timings.first_token is not None
    assert turn.timings.received <= turn.timings.first_token <= turn.timings.done


def test_stream_without_usage_option_has_no_usage_chunk(served) -> None:
    client, _ = client_for(served)
    chunks = list(client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "go"}], stream=True))
    assert all(c.choices for c in chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_then_results_extend_the_chain(served, engine, stream) -> None:
    engine.policy = replay([TWO_CALLS, "Both ran."])
    client, key = client_for(served)
    messages = [{"role": "user", "content": "look around"}]
    if stream:
        calls: dict[int, dict] = {}
        for chunk in client.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                                    stream=True):
            for delta in chunk.choices[0].delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += delta.id or ""
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
        tool_calls = [calls[i] for i in sorted(calls)]
    else:
        reply = client.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                               tool_choice="auto", parallel_tool_calls=True)
        assert reply.choices[0].finish_reason == "tool_calls"
        tool_calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                      for c in reply.choices[0].message.tool_calls]
    assert [json.loads(c["arguments"]) for c in tool_calls] == [{"command": "ls"},
                                                                 {"command": "pwd"}]
    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": c["id"], "type": "function",
         "function": {"name": c["name"], "arguments": c["arguments"]}} for c in tool_calls]})
    messages += [{"role": "tool", "tool_call_id": c["id"], "content": f"out{i}"}
                 for i, c in enumerate(tool_calls)]
    reply = client.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                           stream=stream)
    if stream:
        list(reply)

    first, second = served.store.turns(key)
    assert first.completion.finish_reason == "tool_calls"
    assert len(first.completion.tool_calls) == 2
    prefix = first.completion.tokens.prompt_ids + first.completion.tokens.completion_ids
    # The scripted engine renders with the real template, so the history sent back with the
    # results reproduces the sampled ids: the second prompt extends the first turn.
    assert second.completion.tokens.prompt_ids[: len(prefix)] == prefix
    assert [p.call_id for m in second.request.messages if m.role == "tool"
            for p in m.parts] == [c["id"] for c in tool_calls]


def test_sampling_override_records_requested_and_used(served, engine) -> None:
    seen = []
    engine.policy = lambda request: seen.append(request.sampling) or Reply("ok")
    client, key = client_for(served, sampling={"temperature": 1.0}, unset_sampling=["top_p"])
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                   temperature=0.2, top_p=0.9, max_tokens=64, seed=3,
                                   stop=["\n\n"])
    [turn] = served.store.turns(key)
    assert (turn.requested_sampling.temperature, turn.requested_sampling.top_p) == (0.2, 0.9)
    assert (turn.used_sampling.temperature, turn.used_sampling.top_p) == (1.0, None)
    assert turn.used_sampling.max_tokens == 64 and turn.used_sampling.seed == 3
    assert seen == [turn.used_sampling]


def test_harness_sampling_passes_through_by_default(served, engine) -> None:
    client, key = client_for(served)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                   temperature=0.3, max_completion_tokens=2)
    [turn] = served.store.turns(key)
    assert turn.used_sampling == turn.requested_sampling
    assert turn.used_sampling.max_tokens == 2
    assert len(turn.completion.tokens.completion_ids) == 2
    assert turn.completion.finish_reason == "length"


def test_unknown_fields_are_accepted_and_recorded(served) -> None:
    rollout = served.new_rollout()
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}],
            "prompt_cache_key": "abc", "store": False, "reasoning_effort": "high",
            "stream_options": {"include_usage": True}, "metadata": {"k": [1, 2]}}
    resp = httpx.post(f"{rollout['base_urls']['openai']}/chat/completions", json=body)
    assert resp.status_code == 200
    [turn] = served.store.turns(rollout["key"])
    assert turn.request.extra["prompt_cache_key"] == "abc"
    assert turn.request.extra["metadata"] == {"k": [1, 2]}
    assert turn.request.reasoning_effort == "high"


@pytest.mark.parametrize("header", ["authorization", "x-api-key", "x-goog-api-key"])
def test_key_as_api_key_at_the_root(served, header) -> None:
    rollout = served.new_rollout()
    value = f"Bearer {rollout['key']}" if header == "authorization" else rollout["key"]
    resp = httpx.post(f"{served.url}/v1/chat/completions", headers={header: value},
                      json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert resp.status_code == 200
    assert len(served.store.turns(rollout["key"])) == 1


def test_models_list(served) -> None:
    client, _ = client_for(served)
    assert [m.id for m in client.models.list()] == ["scripted"]


def test_rollout_read_and_close(served) -> None:
    client, key = client_for(served)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    body = httpx.get(f"{served.url}/rollouts/{key}").json()
    assert body["rollout"]["key"] == key and len(body["turns"]) == 1
    assert body["turns"][0]["completion"]["tokens"]["completion_ids"]
    assert httpx.delete(f"{served.url}/rollouts/{key}").json()["closed"] is not None
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])


def test_keys_are_long_and_random(served) -> None:
    keys = {served.new_rollout()["key"] for _ in range(20)}
    assert len(keys) == 20
    assert all(len(k.removeprefix("hrl-")) >= 32 for k in keys)  # 24 bytes, base64


@pytest.mark.parametrize("stream", [False, True])
def test_a_bug_in_the_engine_answers_in_openai_shape_and_is_recorded(served, engine,
                                                                    stream) -> None:
    def broken(_request):
        raise RuntimeError("scripted failure")

    engine.policy = broken
    client, key = client_for(served)
    with pytest.raises(openai.APIError) as caught:
        result = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=stream)
        list(result) if stream else None
    assert "scripted failure" in str(caught.value.message)
    [turn] = served.store.turns(key)
    assert turn.status == "failed" and "scripted failure" in turn.error
    engine.policy = replay(["fine"])
    assert client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}]).choices[0].message.content == "fine"


def test_admin_token_guards_rollouts_and_a_key_reads_only_its_own(engine, tmp_path) -> None:
    proxy = make_proxy(engine, tmp_path / "run", admin_token="s3cret")
    with ServedProxy(proxy).running() as served:
        admin = {"Authorization": "Bearer s3cret"}
        assert httpx.post(f"{served.url}/rollouts", json={}).status_code == 401
        mine, other = (httpx.post(f"{served.url}/rollouts", json={}, headers=admin).json()
                       for _ in range(2))
        own = {"Authorization": f"Bearer {mine['key']}"}
        assert httpx.get(f"{served.url}/rollouts/{mine['key']}", headers=own).status_code == 200
        assert httpx.get(f"{served.url}/rollouts/{other['key']}", headers=own).status_code == 401
        assert httpx.get(f"{served.url}/rollouts/{other['key']}").status_code == 401
        assert httpx.delete(f"{served.url}/rollouts/{other['key']}",
                            headers=own).status_code == 401
        assert httpx.get(f"{served.url}/rollouts/{other['key']}", headers=admin).status_code == 200


def test_anthropic_sdk_through_the_proxy(served, engine, tokenizer) -> None:
    import anthropic

    engine.policy = replay(["Hi from Claude's side.", CALL_TEXT])
    rollout = served.new_rollout()
    client = anthropic.Anthropic(base_url=rollout["base_urls"]["anthropic"],
                                 api_key=rollout["key"], max_retries=0)
    message = client.messages.create(model="claude-x", max_tokens=64,
                                     system="Be brief.",
                                     messages=[{"role": "user", "content": "hello"}])
    assert message.content[0].text == "Hi from Claude's side."
    assert message.stop_reason == "end_turn"
    tools = [{"name": "bash", "description": "run", "input_schema": TOOLS[0]["function"][
        "parameters"]}]
    with client.messages.stream(model="claude-x", max_tokens=64, tools=tools,
                                messages=[{"role": "user", "content": "list"}]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        ("bash", {"command": "ls"})]
    first, second = served.store.turns(rollout["key"])
    assert first.dialect == second.dialect == "anthropic"
    assert list(first.completion.tokens.completion_ids) == expected_ids(
        tokenizer, "Hi from Claude's side.")
    assert second.raw_response.count(b"event: content_block_start") == 1


def test_openai_responses_sdk_through_the_proxy(served, engine, tokenizer) -> None:
    engine.policy = replay(["Plain answer.", CALL_TEXT])
    client, key = client_for(served)
    response = client.responses.create(model="codex-x", input="hello", instructions="brief")
    assert response.output_text == "Plain answer."
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    events = list(client.responses.create(model="codex-x", input="list", tools=tools,
                                          stream=True))
    done = events[-1]
    assert done.type == "response.completed"
    calls = [item for item in done.response.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("bash", {"command": "ls"})]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    first, second = served.store.turns(key)
    assert first.dialect == second.dialect == "openai_responses"
    assert list(first.completion.tokens.completion_ids) == expected_ids(tokenizer,
                                                                        "Plain answer.")
    assert second.completion.tool_calls[0].name == "bash"


def test_root_probe_answers_200(served) -> None:
    assert httpx.head(f"{served.url}/").status_code == 200
    probe = httpx.get(f"{served.url}/")
    assert probe.status_code == 200 and probe.json() == {"status": "ok"}  # no server state


@pytest.mark.parametrize(("body", "words"), [
    ({"unset_sampling": ["top_q"]}, "top_q"),
    ({"sampling": {"temperature": "hot"}}, "temperature"),
    ({"metadata": [1]}, "metadata"),
    ({"smapling": {}}, "smapling"),
])
def test_bad_rollout_options_are_400(served, body, words) -> None:
    resp = httpx.post(f"{served.url}/rollouts", json=body)
    assert resp.status_code == 400 and words in resp.json()["error"]["message"]


def test_a_client_that_leaves_cancels_its_non_streamed_call(tokenizer, tmp_path) -> None:
    """A harness killed at its deadline leaves mid-call: the engine stops sampling (it does
    not run on for nobody) and the turn is stored as cancelled, not as a finished step."""
    engine = ScriptedEngine(tokenizer, replay(["word " * 200]), token_delay=0.02)
    with ServedProxy(make_proxy(engine, tmp_path / "run")).running() as served:
        rollout = served.new_rollout()
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{rollout['base_urls']['openai']}/chat/completions", timeout=0.5,
                       headers={"Authorization": f"Bearer {rollout['key']}"},
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        for _ in range(50):  # the proxy notices the disconnect and records the turn
            turns = served.store.turns(rollout["key"])
            if turns:
                break
            time.sleep(0.1)
        assert [(t.status, t.completion) for t in turns] == [("cancelled", None)]
        assert turns[0].timings.done - turns[0].timings.received < 2.0  # not 200 x 20 ms
