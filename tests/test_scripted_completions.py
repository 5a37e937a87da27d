"""The scripted completions server (token mode's scripted backend) against the proxy's real
TokenEngine over loopback: the wire in vLLM's shapes, whole and streamed; the ids are the
policy's reply tokenized; a conversation through the proxy keeps its ids, and the
conformance check sees it when a backend drops one (no harness runs here)."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from harnessrl.harnesses import get
from harnessrl.proxy.engines.policy import WriteFilePolicy
from harnessrl.proxy.engines.scripted import Reply, default_logprob, replay
from harnessrl.proxy.engines.scripted_completions import FIELD, ScriptedCompletions
from harnessrl.proxy.engines.token.engine import TokenEngine
from harnessrl.proxy.serve import in_thread, running
from harnessrl.proxy.wire.accumulate import accumulate
from harnessrl.rollout.conformance import Result, _check_trace
from harnessrl.types import ChatRequest, Message, Sampling, Text, Tool
from tests.helpers import DropsAToken, engine_events

BASH = {"type": "object", "properties": {"command": {"type": "string"}},
        "required": ["command"]}
CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'



def _engine_events(tokenizer, server: ScriptedCompletions, policy, *, stream: bool,
                   max_tokens: int | None = None) -> tuple[list, list]:
    request = ChatRequest(model="m", messages=(Message("user", (Text("list the files"),)),),
                          tools=(Tool("bash", None, BASH),),
                          sampling=Sampling(max_tokens=max_tokens))

    with in_thread(server.app()) as (url, _):
        engine = TokenEngine(url, tokenizer, extra_body=server.extra_body(policy))
        events = engine_events(engine, request, stream=stream)
    return events, server.bodies


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_the_policys_reply_comes_back_as_its_ids_with_logprobs(tokenizer, stream) -> None:
    text = f"Looking.\n{CALL}"
    events, [body] = _engine_events(tokenizer, ScriptedCompletions(tokenizer),
                                    replay([text]), stream=stream)
    acc = accumulate(events)
    completion = acc.completion()
    expected = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    assert list(completion.tokens.completion_ids) == expected
    assert list(completion.tokens.logprobs) == [default_logprob(i)
                                                for i in range(len(expected))]
    assert list(acc.prompt_ids) == body["prompt"] and acc.flags() == []  # echoed
    assert body[FIELD]["text"] == text and body["stream"] is stream
    assert [c.name for c in completion.tool_calls] == ["bash"]
    assert completion.finish_reason == "tool_calls"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_max_tokens_cuts_the_reply(tokenizer, stream) -> None:
    events, _ = _engine_events(tokenizer, ScriptedCompletions(tokenizer),
                               replay(["one two three four five six"]), stream=stream,
                               max_tokens=3)
    completion = accumulate(events).completion()
    assert len(completion.tokens.completion_ids) == 3 and completion.finish_reason == "length"


def test_a_prompt_longer_than_the_model_is_refused(tokenizer) -> None:
    from harnessrl.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="maximum context length"):
        _engine_events(tokenizer, ScriptedCompletions(tokenizer, max_model_len=8),
                       replay(["hi"]), stream=False)


def _conversation(tokenizer, tmp_path: Path, server: ScriptedCompletions, *,
                  stream: bool) -> Result:
    """Two turns of a write-file conversation through the proxy in token mode, the
    history sent back as an OpenAI client sends it; checked as conformance checks."""
    harness = get("pi")
    policy = WriteFilePolicy("hello.txt", "amber brook 7", harness.finish)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": BASH}}]
    with in_thread(server.app()) as (url, _):
        engine = TokenEngine(url, tokenizer, extra_body=server.extra_body(policy))
        with running(engine, tmp_path / "run") as served:
            key = _rollout(served.url)
            client = openai.OpenAI(base_url=f"{served.url}/r/{key}/v1", api_key="x")
            messages: list = [{"role": "user", "content": "write hello.txt"}]
            for _ in range(2):
                reply = _ask(client, messages, tools, stream=stream)
                messages.append(reply)
                for call in reply.get("tool_calls") or []:
                    messages.append({"role": "tool", "tool_call_id": call["id"],
                                     "content": "ok"})
            turns = served.store.turns(key)
    result = Result(harness.name, harness.version, harness.dialect, "token")
    _check_trace(harness, turns, result)
    return result


def _rollout(url: str) -> str:
    import httpx

    resp = httpx.post(f"{url}/rollouts", json={"metadata": {"harness": "driver"}})
    resp.raise_for_status()
    return resp.json()["key"]


def _ask(client, messages, tools, *, stream: bool) -> dict:
    if not stream:
        message = client.chat.completions.create(model="m", messages=messages,
                                                 tools=tools).choices[0].message
        return message.model_dump(exclude_none=True)
    text, calls = "", {}
    for chunk in client.chat.completions.create(model="m", messages=messages, tools=tools,
                                                stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        text += (delta.content or "") if delta else ""
        for c in (delta.tool_calls or []) if delta else []:
            entry = calls.setdefault(c.index, {"id": "", "type": "function",
                                               "function": {"name": "", "arguments": ""}})
            entry["id"] += c.id or ""
            entry["function"]["name"] += c.function.name or ""
            entry["function"]["arguments"] += c.function.arguments or ""
    message: dict = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_token_mode_keeps_the_chain_and_a_dropped_token_breaks_it(tokenizer, tmp_path,
                                                                    stream) -> None:
    good = _conversation(tokenizer, tmp_path / "good", ScriptedCompletions(tokenizer),
                         stream=stream)
    assert good.passed, good.problems
    assert good.turns == 2 and good.chain_extended is True and good.extension_rate == 1.0
    broken = _conversation(tokenizer, tmp_path / "broken", DropsAToken(tokenizer),
                           stream=stream)
    assert broken.chain_extended is False
    assert "the turn carrying the tool result does not extend the call" in broken.problems


def test_a_reply_is_asked_of_the_policy_with_the_parsed_request() -> None:
    seen: list[ChatRequest] = []

    def policy(request: ChatRequest) -> Reply:
        seen.append(request)
        return Reply("hi", logprobs=[-1.0, -2.0], eos=False)

    request = ChatRequest(model="m", messages=(Message("user", (Text("x"),)),))
    extra = ScriptedCompletions.extra_body(policy)(request)
    assert seen == [request]
    assert json.loads(json.dumps(extra)) == {FIELD: {"text": "hi", "eos": False,
                                                     "logprobs": [-1.0, -2.0]}}
