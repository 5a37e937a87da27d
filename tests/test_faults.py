"""Engine faults in every dialect (issue 8, item 2), with the official SDKs as clients.

The engine is `FakeVLLM` behind the real `VLLMEngine`. Killed mid-stream: the client gets
its dialect's error event after the tokens already sent, its SDK raises, the turn is stored
as failed with the tokens sampled so far, and it never becomes a trainable sample. Not
streamed: an engine 500 or garbage is a 502, an engine slower than the read timeout a 504,
each in the dialect's error shape, and the proxy serves the next request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types
from starlette.requests import Request
from starlette.responses import Response

from harnessrl.proxy.engines.vllm import VLLMEngine
from harnessrl.proxy.serve import in_thread
from harnessrl.rollout.chains import link
from tests.conftest import ServedProxy, make_proxy
from tests.fake_vllm import PROMPT_IDS, TOKENS, FakeVLLM

READ_TIMEOUT = 0.5
SLOW = 1.5  # how long the `slow` engine takes: past the read timeout
SENT_BEFORE_CUT = [t[1] for t in TOKENS[:2]]  # `cut` dies after two tokens: "Hel", "lo"


class QuickFake(FakeVLLM):
    """FakeVLLM whose `slow` mode outlasts the read timeout by a second, not five (its
    server's shutdown waits for the sleeping handler)."""

    async def chat(self, request: Request) -> Response:
        if self.mode == "slow":
            await asyncio.sleep(SLOW)
            return Response(b"{}", media_type="application/json")
        return await super().chat(request)


@pytest.fixture
def fake() -> Iterator[FakeVLLM]:
    fake = QuickFake()
    with in_thread(fake.app()) as (url, server):
        fake.url, fake.server = url, server  # type: ignore[attr-defined]
        yield fake


@pytest.fixture
def served(fake, tmp_path: Path) -> Iterator[ServedProxy]:
    engine = VLLMEngine(fake.url, read_timeout=READ_TIMEOUT)  # type: ignore[attr-defined]
    with ServedProxy(make_proxy(engine, tmp_path / "run")).running() as served:
        rollout = served.new_rollout()
        served.key, served.root = rollout["key"], rollout["base_url"]  # type: ignore[attr-defined]
        yield served


# ------------------------------------------------------------------ the dialects
def _sdk_chat(served, stream: bool) -> Any:
    client = openai.OpenAI(base_url=f"{served.root}/v1", api_key=served.key, max_retries=0,
                           timeout=30)
    reply = client.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "hi"}], stream=stream)
    return list(reply) if stream else reply


def _sdk_responses(served, stream: bool) -> Any:
    client = openai.OpenAI(base_url=f"{served.root}/v1", api_key=served.key, max_retries=0,
                           timeout=30)
    reply = client.responses.create(model="fake", input="hi", stream=stream)
    return list(reply) if stream else reply


def _sdk_anthropic(served, stream: bool) -> Any:
    client = anthropic.Anthropic(base_url=served.root, api_key=served.key, max_retries=0,
                                 timeout=30)
    reply = client.messages.create(model="fake", max_tokens=64, stream=stream,
                                   messages=[{"role": "user", "content": "hi"}])
    return list(reply) if stream else reply


def _sdk_gemini(served, stream: bool) -> Any:
    client = genai.Client(api_key=served.key, http_options=genai_types.HttpOptions(
        base_url=served.root, timeout=30_000,
        retry_options=genai_types.HttpRetryOptions(attempts=1)))
    if stream:
        return list(client.models.generate_content_stream(model="fake", contents="hi"))
    return client.models.generate_content(model="fake", contents="hi")


def _openai_error(body: Any) -> dict:
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def _anthropic_error(body: Any) -> dict:
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return body["error"]


def _gemini_error(body: Any) -> dict:
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "status"}
    return body["error"]


@dataclass
class Dialect:
    name: str
    path: str
    stream_path: str
    body: dict[str, Any]
    sdk: Callable[[Any, bool], Any]
    sdk_error: type[BaseException] | tuple[type[BaseException], ...]
    error_shape: Callable[[Any], dict]
    error_event: bytes  # how the client's last SSE event starts when the stream breaks
    types: dict[int, str]  # status -> the dialect's error type/status for it

    def post(self, served, *, stream: bool = False, timeout: float = 30) -> httpx.Response:
        body = {**self.body, "stream": True} if stream and self.name != "gemini" else self.body
        params = {"alt": "sse"} if stream and self.name == "gemini" else None
        return httpx.post(f"{served.root}{self.stream_path if stream else self.path}",
                          json=body, params=params, timeout=timeout)

    def error_type(self, error: dict) -> str:
        return error.get("status") or error["type"]


_USER = [{"role": "user", "content": "hi"}]
DIALECTS = [
    Dialect("openai_chat", "/v1/chat/completions", "/v1/chat/completions",
            {"model": "fake", "messages": _USER}, _sdk_chat, openai.APIError, _openai_error,
            b'data: {"error":', {502: "api_error", 504: "timeout"}),
    Dialect("openai_responses", "/v1/responses", "/v1/responses",
            {"model": "fake", "input": "hi"}, _sdk_responses, openai.APIError, _openai_error,
            b"event: error\n", {502: "api_error", 504: "timeout"}),
    Dialect("anthropic", "/v1/messages", "/v1/messages",
            {"model": "fake", "max_tokens": 64, "messages": _USER}, _sdk_anthropic,
            anthropic.APIError, _anthropic_error, b"event: error\n",
            {502: "api_error", 504: "timeout_error"}),
    Dialect("gemini", "/v1beta/models/fake:generateContent",
            "/v1beta/models/fake:streamGenerateContent",
            {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}, _sdk_gemini,
            genai_errors.APIError, _gemini_error, b'data: {"error":',
            {502: "INTERNAL", 504: "DEADLINE_EXCEEDED"}),
]
IDS = [d.name for d in DIALECTS]


def still_serves(served, dialect: Dialect) -> None:
    resp = dialect.post(served)
    assert resp.status_code == 200, resp.text
    assert "Hello!" in resp.text
    assert served.store.turns(served.key)[-1].status == "ok"


# ------------------------------------------------------------------ killed mid-stream
@pytest.mark.parametrize("dialect", DIALECTS, ids=IDS)
def test_engine_killed_mid_stream(served, fake, dialect: Dialect) -> None:
    fake.mode = "cut"
    # On the wire: the tokens already sampled, then the dialect's error event, last.
    resp = dialect.post(served, stream=True)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith(
        "text/event-stream")
    content = resp.content
    error_at = content.rfind(dialect.error_event)
    assert error_at > 0, content
    assert 0 <= content.find(b'"Hel"') < content.find(b'"lo"') < error_at, content
    last = content.rstrip().rsplit(b"\n\n", 1)[-1]
    assert last.startswith(dialect.error_event), content
    assert b"broke off" in last and b"internal proxy error" not in content

    # The dialect's own SDK raises: no hang, no silent success.
    with pytest.raises(dialect.sdk_error) as caught:
        dialect.sdk(served, True)
    assert "broke off" in str(caught.value)

    turns = served.store.turns(served.key)
    assert len(turns) == 2
    for turn in turns:
        assert turn.status == "failed" and turn.dialect == dialect.name
        assert "broke off" in turn.error and turn.error.startswith(f"{turn.error_kind}: ")
        assert list(turn.completion.tokens.prompt_ids) == PROMPT_IDS
        assert list(turn.completion.tokens.completion_ids) == SENT_BEFORE_CUT
        assert dialect.error_event in turn.raw_response  # what the client was sent
    # A failed turn never becomes a trainable sample.
    linked = link(turns)
    assert linked.chains == []
    assert [(e.turn, e.reason) for e in linked.excluded] == [(t.index, "failed") for t in turns]

    fake.mode = "ok"
    still_serves(served, dialect)
    assert len(link(served.store.turns(served.key)).chains) == 1


# ------------------------------------------------------------------ not streamed
@pytest.mark.parametrize(("mode", "status", "words"), [
    ("error500", 502, "engine core died"),
    ("garbage", 502, "not the expected JSON"),
    ("slow", 504, "in time"),
])
@pytest.mark.parametrize("dialect", DIALECTS, ids=IDS)
def test_engine_failure_not_streamed(served, fake, dialect: Dialect, mode: str, status: int,
                                     words: str) -> None:
    fake.mode = mode
    resp = dialect.post(served)
    assert resp.status_code == status, resp.text
    error = dialect.error_shape(resp.json())
    assert words in error["message"]
    assert dialect.error_type(error) == dialect.types[status]

    with pytest.raises(dialect.sdk_error) as caught:
        dialect.sdk(served, False)
    code = getattr(caught.value, "status_code", None) or getattr(caught.value, "code", None)
    assert code == status, caught.value

    turns = served.store.turns(served.key)
    assert [t.status for t in turns] == ["failed", "failed"]
    assert all(words in t.error for t in turns)
    # The kind is a field (what the runner counts as an engine failure), not parsed.
    assert all(t.error_kind in ("engine_error", "timeout")
               and t.error.startswith(f"{t.error_kind}: ") for t in turns), turns
    assert link(turns).chains == []

    fake.mode = "ok"
    still_serves(served, dialect)
