"""The four dialects as the proxy-level tests see them, in one table (`WIRE`): routes,
a good body (a harness-like driver's first request), the error shape, how a broken
stream ends, the official SDK call and its error. The proxy, fault, fuzz and disk-full
tests parametrize over it; each takes the fields it needs."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anthropic
import httpx
import openai
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from tests.helpers import SCHEMA


# ------------------------------------------------------------------ harness-like drivers
class Driver(Protocol):
    """Writes a conversation the way a harness of this dialect does."""

    path: str

    def body(self, history: list) -> dict: ...
    def start(self) -> list: ...
    def extend(self, history: list, reply: dict) -> list: ...


class Chat:
    path = "/v1/chat/completions"

    def body(self, history: list) -> dict:
        return {"model": "m", "messages": history, "tools": [
            {"type": "function", "function": {"name": "bash", "parameters": SCHEMA}}]}

    def start(self) -> list:
        return [{"role": "user", "content": "make hello.txt"}]

    def extend(self, history: list, reply: dict) -> list:
        message = reply["choices"][0]["message"]
        results = [{"role": "tool", "tool_call_id": c["id"], "content": "ok"}
                   for c in message.get("tool_calls") or []]
        return [*history, message, *results]


class Anthropic:
    path = "/v1/messages"

    def body(self, history: list) -> dict:
        return {"model": "claude", "max_tokens": 256, "messages": history,
                "tools": [{"name": "bash", "input_schema": SCHEMA}]}

    def start(self) -> list:
        return [{"role": "user", "content": "make hello.txt"}]

    def extend(self, history: list, reply: dict) -> list:
        results = [{"type": "tool_result", "tool_use_id": b["id"], "content": "ok"}
                   for b in reply["content"] if b["type"] == "tool_use"]
        return [*history, {"role": "assistant", "content": reply["content"]},
                *([{"role": "user", "content": results}] if results else [])]


class Responses:
    path = "/v1/responses"

    def body(self, history: list) -> dict:
        return {"model": "codex", "input": history, "store": False,
                "include": ["reasoning.encrypted_content"],
                "tools": [{"type": "function", "name": "bash", "parameters": SCHEMA}]}

    def start(self) -> list:
        return [{"type": "message", "role": "user", "content": "make hello.txt"}]

    def extend(self, history: list, reply: dict) -> list:
        results = [{"type": "function_call_output", "call_id": i["call_id"], "output": "ok"}
                   for i in reply["output"] if i["type"] == "function_call"]
        return [*history, *reply["output"], *results]


class Gemini:
    path = "/v1beta/models/gemini-x:generateContent"

    def body(self, history: list) -> dict:
        return {"contents": history, "tools": [{"functionDeclarations": [
            {"name": "bash", "parametersJsonSchema": SCHEMA}]}]}

    def start(self) -> list:
        return [{"role": "user", "parts": [{"text": "make hello.txt"}]}]

    def extend(self, history: list, reply: dict) -> list:
        content = reply["candidates"][0]["content"]
        results = [{"functionResponse": {"name": p["functionCall"]["name"],
                                         "id": p["functionCall"].get("id"),
                                         "response": {"output": "ok"}}}
                   for p in content["parts"] if "functionCall" in p]
        return [*history, content, *([{"role": "user", "parts": results}] if results else [])]


# ------------------------------------------------------------------ SDK calls
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


# ------------------------------------------------------------------ error shapes
def openai_shape(status: int, body: Any) -> bool:
    return (isinstance(body, dict) and set(body) == {"error"}
            and isinstance(body["error"], dict)
            and set(body["error"]) == {"message", "type", "param", "code"}
            and isinstance(body["error"]["message"], str)
            and isinstance(body["error"]["type"], str))


def anthropic_shape(status: int, body: Any) -> bool:
    return (isinstance(body, dict) and body.get("type") == "error"
            and isinstance(body.get("error"), dict)
            and set(body["error"]) == {"type", "message"}
            and isinstance(body["error"]["message"], str))


def gemini_shape(status: int, body: Any) -> bool:
    return (isinstance(body, dict) and set(body) == {"error"}
            and isinstance(body["error"], dict)
            and set(body["error"]) == {"code", "message", "status"}
            and body["error"]["code"] == status and isinstance(body["error"]["status"], str))


# ------------------------------------------------------------------ the table
@dataclass(frozen=True)
class WireDialect:
    name: str
    driver: Driver
    stream_path: str
    plain: dict[str, Any]  # the smallest good body: one user message "hi", no tools
    recorded_paths: tuple[str, ...]  # where this dialect's recorded harness requests went
    shape: Callable[[int, Any], bool]  # is (status, body) this dialect's error shape
    stream_error: bytes  # the marker of this dialect's error event in a stream
    last_event: bytes  # how the last event of a failed stream starts
    types: dict[int, str]  # status -> the dialect's error type (or status) for it
    sdk: Callable[[Any, bool], Any]  # the official SDK's call (served, stream)
    sdk_error: type[BaseException]

    @property
    def path(self) -> str:
        return self.driver.path

    @property
    def good(self) -> dict[str, Any]:
        """A good first request with a bash tool, as the driver writes it."""
        return self.driver.body(self.driver.start())

    def streamed(self, body: dict[str, Any], stream: bool) -> tuple[str, dict, dict | None]:
        """(path, body, query) of `body` sent streamed or not: by a flag in the body,
        except Gemini (by its path and `alt=sse`)."""
        if not stream:
            return self.path, body, None
        if self.name == "gemini":
            return self.stream_path, body, {"alt": "sse"}
        return self.stream_path, {**body, "stream": True}, None

    def good_bytes(self, *, stream: bool = False) -> bytes:
        """The good body as sent, streamed or not (the path is the caller's)."""
        return json.dumps(self.streamed(self.good, stream)[1]).encode()

    def post(self, served, *, stream: bool = False, timeout: float = 30) -> httpx.Response:
        """The plain body to `served.root` (a rollout's base URL)."""
        path, body, params = self.streamed(self.plain, stream)
        return httpx.post(f"{served.root}{path}", json=body, params=params, timeout=timeout)

    def error(self, status: int, body: Any) -> dict:
        """The error object of an answer, which must be in this dialect's shape."""
        assert self.shape(status, body), body
        return body["error"]

    def error_type(self, error: dict) -> str:
        return error.get("status") or error["type"]


_USER = [{"role": "user", "content": "hi"}]
WIRE = [
    WireDialect("openai_chat", Chat(), "/v1/chat/completions",
                {"model": "fake", "messages": _USER},
                ("/v1/chat/completions", "/chat/completions"), openai_shape,
                b'data: {"error":', b'data: {"error":', {502: "api_error", 504: "timeout"},
                _sdk_chat, openai.APIError),
    WireDialect("anthropic", Anthropic(), "/v1/messages",
                {"model": "fake", "max_tokens": 64, "messages": _USER}, ("/v1/messages",),
                anthropic_shape, b"event: error\n", b"event: error\n",
                {502: "api_error", 504: "timeout_error"}, _sdk_anthropic, anthropic.APIError),
    WireDialect("openai_responses", Responses(), "/v1/responses",
                {"model": "fake", "input": "hi"}, ("/v1/responses",), openai_shape,
                b"event: response.failed\n", b"event: error\n",
                {502: "api_error", 504: "timeout"}, _sdk_responses, openai.APIError),
    WireDialect("gemini", Gemini(), "/v1beta/models/gemini-x:streamGenerateContent",
                {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
                ("/v1beta/models",), gemini_shape, b'data: {"error":', b'data: {"error":',
                {502: "INTERNAL", 504: "DEADLINE_EXCEEDED"}, _sdk_gemini, genai_errors.APIError),
]
IDS = [d.name for d in WIRE]
BY_NAME = {d.name: d for d in WIRE}
