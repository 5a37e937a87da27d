"""What the fuzz tests share (tests/test_fuzz.py, tests/test_fuzz_limits.py): the proxy
in process on a loop of its own, the four dialects with a good body, seeds and their error
shapes, the properties every answer must have, paths into a JSON body, and a vLLM stand-in
that sends whatever bytes it is given."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

import httpx
from hypothesis import HealthCheck, settings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.dialects import WIRE, WireDialect
from tests.fake_vllm import PROMPT_IDS
from tests.helpers import recorded_requests


def fuzz(max_examples: int) -> settings:
    return settings(max_examples=max_examples, deadline=None,
                    suppress_health_check=list(HealthCheck))


# ------------------------------------------------------------------ an event loop in a thread
class LoopThread:
    """One event loop on its own thread for the module: sync hypothesis tests submit
    coroutines to it, and pytest-asyncio's loops are left alone."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()



class InProcess:
    """The proxy app behind an `httpx.AsyncClient` on the module's loop."""

    def __init__(self, proxy, loop: LoopThread) -> None:
        self.proxy, self.loop, self.store = proxy, loop, proxy.store
        self.client: httpx.AsyncClient | None = None
        self.key = ""

    def __enter__(self) -> InProcess:
        async def start() -> None:
            await self.proxy.startup()
            self.client = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=self.proxy.app()), base_url="http://proxy",
                timeout=60)
        self.loop.run(start())
        resp = self.post("/rollouts", b"{}")
        assert resp.status_code == 201, resp.text
        self.key = resp.json()["key"]
        return self

    def __exit__(self, *_exc: object) -> None:
        async def stop() -> None:
            assert self.client is not None
            await self.client.aclose()
            await self.proxy.shutdown()
        self.loop.run(stop())

    def post(self, path: str, content: bytes, params: dict[str, str] | None = None
             ) -> httpx.Response:
        assert self.client is not None
        return self.loop.run(self.client.post(
            path, content=content, params=params,
            headers={"content-type": "application/json"}))

    def call(self, dialect: WireDialect, content: bytes, *, stream: bool = False) -> httpx.Response:
        path = dialect.stream_path if stream else dialect.path
        params = {"alt": "sse"} if stream and dialect.name == "gemini" else None
        return self.post(f"/r/{self.key}{path}", content, params)


# ------------------------------------------------------------------ the dialects
def internal_error(body: Any) -> bool:
    """The proxy's own fault, in any of the shapes."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return False
    return (err.get("type") == "server_error"
            or (err.get("type") == "api_error" and "internal proxy error" in str(
                err.get("message")))
            or "internal proxy error" in str(err.get("message")))


def wire_bodies(paths: tuple[str, ...]) -> list[dict[str, Any]]:
    bodies = []
    for file in recorded_requests():
        wire = json.loads(file.read_text())
        if any(wire["path"].startswith(p) for p in paths) and isinstance(wire["body"], dict):
            bodies.append(wire["body"])
    return bodies


# Seeds of the mutations: the dialect's good body and every recorded harness request.
SEEDS = {d.name: [d.good, *wire_bodies(d.recorded_paths)] for d in WIRE}


def check_answer(dialect: WireDialect, resp: httpx.Response, sent: bytes) -> None:
    """The properties every answer must have, whatever was sent."""
    status = resp.status_code
    assert status < 500, f"{dialect.name}: {status} {resp.text[:500]} for {sent[:300]!r}"
    if status == 200:
        # A stream (the body kept `stream: true`) must not have failed on our side either.
        assert b"internal proxy error" not in resp.content, (sent[:300], resp.content[-500:])
        return
    body = resp.json()
    assert dialect.shape(status, body), f"{dialect.name}: bad error shape {body} for {sent!r:.300}"
    assert not internal_error(body), f"{dialect.name}: internal error {body} for {sent!r:.300}"



Path_ = tuple[str | int, ...]


def paths(value: Any, prefix: Path_ = ()) -> Iterator[Path_]:
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, (*prefix, index))


def get_at(body: Any, path: Path_) -> Any:
    for step in path:
        body = body[step]
    return body


def set_at(body: Any, path: Path_, value: Any) -> Any:
    if not path:
        return value
    get_at(body, path[:-1])[path[-1]] = value
    return body


def delete_at(body: Any, path: Path_) -> Any:
    if path:
        parent = get_at(body, path[:-1])
        del parent[path[-1]]
    return body



PLACE = "\u0000PLACEHOLDER\u0000"
PLACE_BYTES = json.dumps(PLACE).encode()



def nested(depth: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth



class BrokenVLLM:
    """vLLM's models endpoint, and a chat stream that sends whatever bytes it is given."""

    def __init__(self) -> None:
        self.script: list[bytes] = []
        self.ok = False

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/models", self.models),
                                 Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def models(self, _request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        script = good_stream() if self.ok else list(self.script)

        async def stream():
            for piece in script:
                yield piece
                await asyncio.sleep(0)

        if not body.get("stream"):
            return Response(b"".join(script), media_type="application/json")
        return StreamingResponse(stream(), media_type="text/event-stream")


def chat_chunk(text: str, token: int, finish: str | None = None) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion.chunk", "model": "fake", "choices": [{
        "index": 0, "delta": {"content": text}, "finish_reason": finish, "token_ids": [token],
        "logprobs": {"content": [{"token": text, "logprob": -0.5}]}}]}


FIRST_CHUNK = {"id": "x", "object": "chat.completion.chunk", "model": "fake",
          "prompt_token_ids": PROMPT_IDS,
          "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                       "token_ids": [], "logprobs": None}]}


def sse_frame(body: Any) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def good_stream() -> list[bytes]:
    return [sse_frame(FIRST_CHUNK), sse_frame(chat_chunk("Hi", 10)),
            sse_frame(chat_chunk("", 11, "stop")), b"data: [DONE]\n\n"]


