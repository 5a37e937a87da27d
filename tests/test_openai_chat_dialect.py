"""The chat dialect as pure functions: real harness requests parse; replies render to the
golden wire bytes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harnessrl.errors import InvalidRequest, NotFound
from harnessrl.proxy.dialects import openai_chat
from harnessrl.proxy.dialects.base import ReplyContext
from harnessrl.proxy.engines import openai_wire
from harnessrl.types import (
    Chunk,
    Completion,
    Finished,
    Reasoning,
    ReasoningDelta,
    Started,
    Text,
    TextDelta,
    Tokens,
    ToolCall,
    ToolCallDelta,
    ToolResult,
    Usage,
)
from tests.helpers import recorded_requests

GOLDEN = Path(__file__).parent / "golden"
CHAT_HARNESSES = ["opencode", "qwen", "hermes-agent", "kimi-cli", "mini-swe-agent",
                  "aider-chat", "pi", "openhands", "kilo"]
CTX = ReplyContext("chatcmpl-1", 1700000000, "their-model")


@pytest.mark.parametrize("path", recorded_requests(*CHAT_HARNESSES),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_harness_requests_parse_and_keep_unknown_fields(path: Path) -> None:
    body = json.loads(path.read_text())["body"]
    request = openai_chat.parse_request(body)
    assert len(request.messages) == len(body["messages"])
    assert len(request.tools) == len(body.get("tools", []))
    for key in set(body) - openai_chat._MAPPED:
        assert request.extra[key] == body[key]
    # What the engine is sent keeps every message (tool results split out, none lost).
    assert len(openai_wire.messages(request)) >= len(body["messages"])


def test_assistant_history_with_reasoning_and_calls() -> None:
    request = openai_chat.parse_request({"model": "m", "messages": [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": [{"type": "text", "text": "a"},
                                     {"type": "image_url", "image_url": {"url": "data:x"}}]},
        {"role": "assistant", "content": None, "reasoning_content": "hmm",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "bash", "arguments": {"command": "ls"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "file.txt"},
    ]})
    system, user, assistant, tool = request.messages
    assert system.role == "system" and len(user.parts) == 2
    assert assistant.parts == (Reasoning("hmm"), ToolCall("c1", "bash", '{"command":"ls"}'))
    assert tool.parts == (ToolResult("c1", (Text("file.txt"),)),)
    sent = openai_wire.messages(request)
    assert sent[2] == {"role": "assistant", "content": None, "reasoning_content": "hmm",
                       "tool_calls": [{"id": "c1", "type": "function", "function": {
                           "name": "bash", "arguments": '{"command":"ls"}'}}]}
    assert sent[3] == {"role": "tool", "tool_call_id": "c1", "content": "file.txt"}


def test_max_completion_tokens_wins_and_stop_string_becomes_list() -> None:
    request = openai_chat.parse_request({"model": "m", "messages": [{"role": "user",
                                         "content": "x"}], "max_tokens": 5,
                                         "max_completion_tokens": 9, "stop": "END"})
    assert request.sampling.max_tokens == 9 and request.sampling.stop == ("END",)


def test_error_shapes() -> None:
    status, body = openai_chat.render_error(InvalidRequest("fix `x`", param="x"))
    assert status == 400 and json.loads(body) == {"error": {
        "message": "fix `x`", "type": "invalid_request_error", "param": "x", "code": None}}
    status, body = openai_chat.render_error(NotFound("no such model", param="model"))
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"


EVENTS = [
    Started("served", (1, 2, 3)),
    Chunk((ReasoningDelta("think"),), (5,), (-0.5,)),
    Chunk((TextDelta("Hi"),), (6,), (-0.25,)),
    Chunk((ToolCallDelta(0, "call_1", "bash", '{"comm'),), (7,), (-1.0,)),
    Chunk((ToolCallDelta(0, None, None, 'and": "ls"}'),), (8, 2), (-0.125, -0.0625)),
    Finished("tool_calls", Usage(3, 5)),
]


def check_golden(name: str, data: bytes) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_bytes(data)
    assert data == path.read_bytes()


def test_stream_encoding_matches_golden() -> None:
    request = openai_chat.parse_request({"model": "their-model", "stream": True,
                                         "stream_options": {"include_usage": True},
                                         "messages": [{"role": "user", "content": "x"}]})
    encoder = openai_chat.stream_encoder(request, CTX)
    check_golden("openai_chat_stream.sse", b"".join(encoder.feed(e) for e in EVENTS))


def test_completion_rendering_matches_golden() -> None:
    completion = Completion("served", (Reasoning("think"), Text("Hi"),
                                       ToolCall("call_1", "bash", '{"command": "ls"}')),
                            "tool_calls", Usage(3, 5), Tokens((1,), (5,), (-0.5,)))
    check_golden("openai_chat_completion.json", openai_chat.render_completion(completion, CTX))
