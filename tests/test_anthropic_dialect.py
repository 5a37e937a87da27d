"""The Anthropic Messages dialect as pure functions: real Claude Code requests parse, replies
render to golden wire bytes the official SDK reads, and what we emit parses back unchanged."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anthropic
import msgspec
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from harnessrl.errors import (
    EngineTimeout,
    EngineUnavailable,
    HarnessRLError,
    InvalidRequest,
    NotFound,
    TooLarge,
)
from harnessrl.proxy.dialects import anthropic as dialect
from harnessrl.proxy.dialects import anthropic_request
from harnessrl.proxy.dialects.base import ReplyContext
from harnessrl.proxy.wire.sse import SSEDecoder, SSEEvent
from harnessrl.types import (
    Chunk,
    Completion,
    Finished,
    Image,
    Message,
    Reasoning,
    ReasoningDelta,
    Started,
    Text,
    TextDelta,
    Tokens,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolResult,
    Usage,
)
from tests.helpers import recorded_requests

try:  # newer SDKs speak httpx2 and reject plain httpx objects
    import httpx2 as http
except ImportError:  # pragma: no cover
    import httpx as http  # type: ignore[no-redef]

GOLDEN = Path(__file__).parent / "golden"
CTX = ReplyContext("msg_1", 1700000000, "their-model")
USER = {"role": "user", "content": "hi"}


def base(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 16, "messages": [USER], **fields}


# ------------------------------------------------------------------ real requests
@pytest.mark.parametrize("path", recorded_requests("claude"), ids=lambda p: p.name)
def test_claude_code_requests_parse_and_keep_unknown_fields(path: Path) -> None:
    body = json.loads(path.read_text())["body"]
    request = dialect.parse_request(body)
    system = 1 if "system" in body else 0
    assert [m.role for m in request.messages[system:]] == [m["role"] for m in body["messages"]]
    assert len(request.tools) == len(body.get("tools", []))
    assert request.sampling.max_tokens == body["max_tokens"] and request.stream is True
    for key in set(body) - anthropic_request.MAPPED:
        assert request.extra[key] == body[key]
    assert request.reasoning_effort == "high"  # output_config.effort


# ------------------------------------------------------------------ hand-written requests
def test_every_block_type_parses() -> None:
    request = dialect.parse_request({
        "model": "m", "max_tokens": 100, "temperature": 0.5, "top_k": 20,
        "stop_sequences": ["END"], "metadata": {"user_id": "u"},
        "system": [{"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "bash", "description": "run", "input_schema": {"type": "object"}},
                  {"type": "web_search_20250305", "name": "web_search"}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": "AAAA"}},
                {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "their-sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "ok"},
                {"type": "tool_use", "id": "toolu_1", "name": "bash",
                 "input": {"command": "ls", "a": [1, 2.5, None, True]}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "out"},
                {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                 "content": [{"type": "text", "text": "bad"}]},
                {"type": "text", "text": "go on", "cache_control": {"type": "ephemeral"}}]},
            {"role": "system", "content": "mid-conversation"},
        ]})
    system, user, assistant, results, mid = request.messages
    assert system == Message("system", (Text("rules"),))
    assert user.parts == (Text("look"), Image("data:image/png;base64,AAAA"),
                          Image("https://x/y.png"))
    assert assistant.parts == (
        Reasoning("hmm", "their-sig"), Reasoning("", encrypted="opaque", redacted=True),
        Text("ok"), ToolCall("toolu_1", "bash", '{"command":"ls","a":[1,2.5,null,true]}'))
    assert results.parts == (ToolResult("toolu_1", (Text("out"),)),
                             ToolResult("toolu_1", (Text("bad"),), is_error=True),
                             Text("go on"))
    assert mid == Message("system", (Text("mid-conversation"),))
    assert [t.name for t in request.tools] == ["bash"]
    assert request.extra["unmapped_tools"] == [{"type": "web_search_20250305",
                                                "name": "web_search"}]
    assert request.tool_choice == ToolChoice("required") and request.parallel_tool_calls is False
    assert request.sampling.stop == ("END",) and request.sampling.top_k == 20
    assert request.extra["thinking"]["type"] == "enabled" and request.reasoning_effort is None


def test_tool_choice_forcing_one_tool() -> None:
    request = dialect.parse_request(base(tool_choice={"type": "tool", "name": "bash"}))
    assert request.tool_choice == ToolChoice("required", "bash")
    assert request.parallel_tool_calls is None


@pytest.mark.parametrize(("body", "param", "words"), [
    (base(messages=[]), "messages", "at least one"),
    ({"model": "m", "messages": [USER]}, "max_tokens", "required"),
    (base(max_tokens="9"), "max_tokens", "integer"),
    (base(messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}]),
     "messages[0].content[0].type", "'document'"),
    (base(messages=[{"role": "tool", "content": "x"}]), "messages[0].role", "tool"),
    (base(messages=[{"role": "user", "content": 7}]), "messages[0].content", "an array"),
    (base(messages=[{"role": "system", "content": [{"type": "image"}]}]),
     "messages[0].content[0].type", "'text'"),
    (base(system=5), "system", "an array"),
    (base(tools=[{"description": "no name"}]), "tools[0].name", "a string"),
    (base(tool_choice={"type": "some"}), "tool_choice.type", "'auto'"),
    (base(messages=[{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]),
     "messages[0].content[0].tool_use_id", "a string"),
    (base(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "file", "file_id": "f"}}]}]),
     "messages[0].content[0].source.type", "'base64'"),
    ([], "body", "an object"),
])
def test_bad_input_names_the_field(body: Any, param: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        dialect.parse_request(body)
    assert info.value.param == param and words in info.value.message
    assert info.value.status == 400


# ------------------------------------------------------------------ errors and models
@pytest.mark.parametrize(("err", "status", "kind"), [
    (InvalidRequest("fix `x`", param="x"), 400, "invalid_request_error"),
    (NotFound("no such model"), 404, "not_found_error"),
    (TooLarge("too big"), 413, "request_too_large"),
    (EngineUnavailable("engine down"), 503, "overloaded_error"),
    (EngineTimeout("slow"), 504, "timeout_error"),
    (HarnessRLError("boom"), 500, "api_error"),
])
def test_error_shapes(err: HarnessRLError, status: int, kind: str) -> None:
    got_status, body = dialect.render_error(err)
    assert got_status == status
    assert json.loads(body) == {"type": "error", "error": {"type": kind, "message": err.message}}


def test_models_and_count_tokens() -> None:
    assert json.loads(dialect.render_models(["a", "b"])) == {
        "data": [{"type": "model", "id": m, "display_name": m,
                  "created_at": "1970-01-01T00:00:00Z"} for m in ("a", "b")],
        "has_more": False, "first_id": "a", "last_id": "b"}
    assert json.loads(dialect.render_models([]))["first_id"] is None
    assert dialect.count_tokens_body(42) == b'{"input_tokens":42}'


# ------------------------------------------------------------------ golden replies
EVENTS = [
    Started("served", (1, 2, 3)),
    Chunk((ReasoningDelta("think"),), (5,), (-0.5,)),
    Chunk((TextDelta("Hi"),), (6,), (-0.25,)),
    Chunk((ToolCallDelta(0, "call_1", "bash", '{"comm'),), (7,), (-1.0,)),
    Chunk((ToolCallDelta(0, None, None, 'and": "ls"}'),), (8, 2), (-0.125, -0.0625)),
    Finished("tool_calls", Usage(3, 5)),
]
COMPLETION = Completion("served", (Reasoning("think"), Text("Hi"),
                                   ToolCall("call_1", "bash", '{"command": "ls"}')),
                        "tool_calls", Usage(3, 5), Tokens((1,), (5,), (-0.5,)))


def check_golden(name: str, data: bytes) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_bytes(data)
    assert data == path.read_bytes()


def encoded_stream(events: list[Any] = EVENTS) -> bytes:
    encoder = dialect.stream_encoder(dialect.parse_request(base(stream=True)), CTX)
    return b"".join(encoder.feed(e) for e in events)


def test_stream_encoding_matches_golden() -> None:
    check_golden("anthropic_stream.sse", encoded_stream())


def test_completion_rendering_matches_golden() -> None:
    check_golden("anthropic_completion.json", dialect.render_completion(COMPLETION, CTX))


def sdk_client(status: int, body: bytes, content_type: str) -> anthropic.Anthropic:
    def handler(_request: http.Request) -> http.Response:
        return http.Response(status, content=body, headers={"content-type": content_type})

    return anthropic.Anthropic(api_key="k", base_url="http://proxy", max_retries=0,
                               http_client=http.Client(transport=http.MockTransport(handler)))


def test_official_sdk_accumulates_the_stream() -> None:
    client = sdk_client(200, encoded_stream(), "text/event-stream")
    with client.messages.stream(model="their-model", max_tokens=16,
                                messages=[USER]) as stream:
        final = stream.get_final_message()
    assert final.id == "msg_1" and final.stop_reason == "tool_use"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (3, 5)
    thinking, text, tool = final.content
    assert (thinking.type, thinking.thinking) == ("thinking", "think")
    assert (text.type, text.text) == ("text", "Hi")
    assert (tool.type, tool.id, tool.name, tool.input) == ("tool_use", "call_1", "bash",
                                                           {"command": "ls"})
    # What the client sends back is the sampled reasoning, signature-less again.
    back = dialect.parse_request(base(messages=[USER, {
        "role": "assistant", "content": [b.model_dump() for b in final.content]}]))
    assert back.messages[1].parts[0] == Reasoning("think")
    assert back.messages[1].parts[2] == ToolCall("call_1", "bash", '{"command":"ls"}')


def test_official_sdk_reads_completion_and_error() -> None:
    client = sdk_client(200, dialect.render_completion(COMPLETION, CTX), "application/json")
    message = client.messages.create(model="their-model", max_tokens=16, messages=[USER])
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[0].signature.startswith("hrl1.")
    status, body = dialect.render_error(InvalidRequest("bad `x`", param="x"))
    with pytest.raises(anthropic.BadRequestError) as info:
        sdk_client(status, body, "application/json").messages.create(
            model="m", max_tokens=1, messages=[USER])
    assert info.value.body["error"]["message"] == "bad `x`"  # type: ignore[index]


def test_stream_error_event() -> None:
    encoder = dialect.stream_encoder(dialect.parse_request(base()), CTX)
    out = encoder.feed(EVENTS[0]) + encoder.error(EngineTimeout("slow"))
    last = decode_all(out)[-1]
    assert last.event == "error" and json.loads(last.data)["error"]["type"] == "timeout_error"


def test_parallel_calls_and_missing_usage() -> None:
    events = [Chunk((ToolCallDelta(0, "a", "f", "{}"), ToolCallDelta(1, "b", "g", '{"x":'))),
              Chunk((ToolCallDelta(1, None, None, "1}"),), (1, 2, 3)),
              Finished("length")]
    client = sdk_client(200, encoded_stream(events), "text/event-stream")
    with client.messages.stream(model="m", max_tokens=1, messages=[USER]) as stream:
        final = stream.get_final_message()
    assert [(b.id, b.input) for b in final.content] == [("a", {}), ("b", {"x": 1})]
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 3


# ------------------------------------------------------------------ properties
def decode_all(data: bytes, cuts: list[int] = []) -> list[SSEEvent]:  # noqa: B006
    decoder, events, last = SSEDecoder(), [], 0
    for cut in [*sorted(cuts), len(data)]:
        events += decoder.feed(data[last:cut])
        last = cut
    return events + decoder.finish()


@given(st.lists(st.integers(0, len(encoded_stream())), max_size=12))
def test_any_byte_split_decodes_to_the_same_events(cuts: list[int]) -> None:
    data = encoded_stream()
    assert decode_all(data, cuts) == decode_all(data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8)


def _compact(value: dict[str, Any]) -> str:
    return msgspec.json.encode(value).decode()


def _not_compact_object(text: str) -> bool:
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return True
    return not isinstance(value, dict) or _compact(value) == text


arguments = (st.dictionaries(st.text(), json_values, max_size=4).map(_compact)
             | st.text().filter(_not_compact_object))
parts = st.one_of(
    st.builds(Text, st.text()),
    st.builds(Reasoning, st.text(), st.none() | st.text()),
    st.builds(lambda t, s, e: Reasoning(t, s, e), st.text(), st.none() | st.text(), st.text()),
    st.builds(lambda e: Reasoning("", encrypted=e, redacted=True), st.text()),
    st.builds(ToolCall, st.text(), st.text(), arguments),
)


@settings(max_examples=200)
@given(st.lists(parts, max_size=5), st.sampled_from(["stop", "length", "tool_calls"]))
def test_parse_of_render_gives_back_the_sampled_parts(parts_: list[Any], finish: Any) -> None:
    for part in parts_:  # a verbatim signature that is exactly ours is indistinguishable
        assume(not (isinstance(part, Reasoning) and part.signature
                    and part.signature.startswith("hrl1.")))
    completion = Completion("served", tuple(parts_), finish, None, Tokens(None, None, None))
    content = json.loads(dialect.render_completion(completion, CTX))["content"]
    request = dialect.parse_request(base(messages=[USER, {"role": "assistant",
                                                          "content": content}]))
    assert request.messages[1].parts == completion.parts
