"""How long the proxy waits for the engine, and when a reply counts as whole (issue 13).

An engine that sends nothing is asked `GET /health` after the first-byte limit; one that
does not answer it fails the call in seconds, not at the generation limit, while a slow
non-streamed generation on a live engine goes on. A reply without a finish reason fails
its call streamed or not, with what was sampled kept in the failed turn.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from harnessrl.proxy.engines.token.engine import TokenEngine
from harnessrl.proxy.engines.vllm import VLLMEngine
from harnessrl.proxy.serve import in_thread
from harnessrl.types import ChatRequest, Finished, Message, Text
from tests.conftest import ServedProxy, make_proxy

FIRST_BYTE = 0.4
GENERATION = 1.5  # the slow engine's non-streamed generation: past FIRST_BYTE, in time
HELLO = {"role": "user", "content": "hi"}


class Engine:
    """vLLM's chat endpoint in its shapes, silent, slow or without a finish reason."""

    def __init__(self) -> None:
        self.chat_mode = "ok"  # ok | silent | slow
        self.health_mode = "ok"  # ok | silent | down
        self.finish: str | None = "stop"
        self.health_checks = 0
        self.released = threading.Event()  # ends every silent wait at teardown

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/models", self.models), Route("/health", self.health),
                                 Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def _silent(self) -> None:
        while not self.released.is_set():
            await asyncio.sleep(0.05)

    async def models(self, _request: Request) -> Response:
        return JSONResponse({"data": [{"id": "fake"}]})

    async def health(self, _request: Request) -> Response:
        self.health_checks += 1
        if self.health_mode == "silent":
            await self._silent()
        return Response(status_code=503 if self.health_mode == "down" else 200)

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        if self.chat_mode == "silent":
            await self._silent()
        if self.chat_mode == "slow":
            await asyncio.sleep(GENERATION)
        choice = {"finish_reason": self.finish, "token_ids": [10, 11],
                  "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -0.25}]}}
        if not body.get("stream"):
            return JSONResponse({"model": "fake", "prompt_token_ids": [1, 2], "choices": [
                {**choice, "message": {"role": "assistant", "content": "Hello!"}}]})
        chunk = {"model": "fake", "prompt_token_ids": [1, 2],
                 "choices": [{**choice, "delta": {"content": "Hello!"}}]}
        return StreamingResponse(iter([f"data: {json.dumps(chunk)}\n\n".encode(),
                                       b"data: [DONE]\n\n"]), media_type="text/event-stream")


@pytest.fixture
def engine() -> Iterator[Engine]:
    fake = Engine()
    with in_thread(fake.app()) as (url, _server):
        fake.url = url  # type: ignore[attr-defined]
        try:
            yield fake
        finally:
            fake.released.set()


@pytest.fixture
def served(engine, tmp_path: Path) -> Iterator[ServedProxy]:
    vllm = VLLMEngine(engine.url, read_timeout=30, first_byte_timeout=FIRST_BYTE)
    with ServedProxy(make_proxy(vllm, tmp_path / "run")).running() as served:
        yield served


def call(served: ServedProxy, *, stream: bool) -> tuple[httpx.Response, float, str]:
    rollout = served.new_rollout()
    start = time.monotonic()
    resp = httpx.post(f"{rollout['base_urls']['openai']}/chat/completions", timeout=60,
                      json={"model": "m", "stream": stream, "messages": [HELLO]})
    return resp, time.monotonic() - start, rollout["key"]


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize("health", ["silent", "down"])
def test_an_engine_that_sends_nothing_and_fails_its_health_check_fails_fast(
        served, engine, stream, health) -> None:
    engine.chat_mode, engine.health_mode = "silent", health
    resp, took, key = call(served, stream=stream)
    assert resp.status_code == 504, resp.text
    assert "health check" in resp.json()["error"]["message"]
    # the first-byte limit, then at most as long again for the health check; not 30 s
    assert took < 2 * FIRST_BYTE + 3, took
    [turn] = served.store.turns(key)
    assert turn.status == "failed" and turn.error.startswith("timeout: ")


def test_a_slow_generation_on_a_live_engine_is_not_cut_off(served, engine) -> None:
    engine.chat_mode = "slow"
    resp, took, key = call(served, stream=False)
    assert resp.status_code == 200, resp.text
    assert took >= GENERATION and engine.health_checks >= 2  # asked, and let go on
    assert [t.status for t in served.store.turns(key)] == ["ok"]


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_a_reply_without_a_finish_reason_fails_streamed_or_not(served, engine, stream) -> None:
    engine.finish = None
    resp, _took, key = call(served, stream=stream)
    if stream:
        assert resp.status_code == 200 and b'data: {"error":' in resp.content, resp.text
        assert b"finish" in resp.content.rsplit(b"data: ", 1)[-1]
    else:
        assert resp.status_code == 502, resp.text
        assert "finish reason" in resp.json()["error"]["message"]
    [turn] = served.store.turns(key)
    assert turn.status == "failed" and "finish" in turn.error
    assert turn.completion is not None and turn.completion.parts == (Text("Hello!"),)  # kept
    assert list(turn.completion.tokens.completion_ids) == [10, 11]


def test_token_mode_leaves_a_reply_without_a_finish_reason_unfinished(tiny_model) -> None:
    async def completions(_request: Request) -> Response:
        return JSONResponse({"choices": [{"text": "Hi", "finish_reason": None,
                                          "token_ids": [5], "prompt_token_ids": [1],
                                          "logprobs": {"token_logprobs": [-0.5]}}]})

    async def models(_request: Request) -> Response:
        return JSONResponse({"data": [{"id": "tiny", "max_model_len": 100}]})

    app = Starlette(routes=[Route("/v1/models", models),
                            Route("/v1/completions", completions, methods=["POST"])])

    async def run(url: str) -> list:
        engine = TokenEngine(url, str(tiny_model))
        await engine.start()
        try:
            return await engine.complete(ChatRequest(
                model="tiny", messages=(Message("user", (Text("hi"),)),)), "k")
        finally:
            await engine.close()

    with in_thread(app) as (url, _server):
        events = asyncio.run(run(url))
    assert events and not any(isinstance(e, Finished) for e in events)
