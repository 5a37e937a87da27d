"""The Responses dialect as pure functions: Codex's requests parse, replies render to golden
wire bytes the official `openai` SDK accepts, and reasoning comes back exactly."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.errors import EngineUnavailable, InvalidRequest, NotFound
from harnessrl.proxy.dialects import openai_responses as responses
from harnessrl.proxy.dialects import openai_responses_request as responses_request
from harnessrl.proxy.dialects.base import ReplyContext
from harnessrl.proxy.wire import sse
from harnessrl.types import (
    ChatRequest,
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
    ToolResult,
    Usage,
)
from tests.helpers import recorded_requests

GOLDEN = Path(__file__).parent / "golden"
CTX = ReplyContext("resp_1", 1700000000, "their-model")
NO_TOKENS = Tokens(None, None, None)


def check_golden(name: str, data: bytes) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_bytes(data)
    assert data == path.read_bytes()


def parse(**body: Any) -> ChatRequest:
    return responses.parse_request({"model": "m", **body})


# ------------------------------------------------------------------ requests
@pytest.mark.parametrize("path", recorded_requests("codex"), ids=lambda p: p.name)
def test_codex_requests_parse_and_keep_unknown_fields(path: Path) -> None:
    body = json.loads(path.read_text())["body"]
    request = responses.parse_request(body)
    assert len(request.messages) == len(body["input"])
    assert [m.role for m in request.messages] == ["system", "system", "user", "user"]
    functions = [t for t in body["tools"] if t["type"] == "function"]
    assert [t.name for t in request.tools] == [t["name"] for t in functions]
    assert request.tools[0].parameters == functions[0]["parameters"]
    assert request.extra["unmapped_tools"] == [t for t in body["tools"] if t["type"] != "function"]
    for key in set(body) - responses_request.MAPPED - {"reasoning"}:
        assert request.extra[key] == body[key]
    assert request.extra["reasoning"] == {"summary": "auto"} and request.reasoning_effort is None
    assert request.stream and request.parallel_tool_calls is True
    assert request.tool_choice is not None and request.tool_choice.mode == "auto"


def test_every_item_type() -> None:
    request = parse(instructions="be brief", max_output_tokens=64, temperature=0.5, top_p=0.9,
                    reasoning={"effort": "high", "summary": "auto"}, store=False,
                    previous_response_id="resp_0", tool_choice={"type": "function", "name": "sh"},
                    tools=[{"type": "function", "name": "sh", "parameters": {"type": "object"},
                            "strict": False}, {"type": "custom", "name": "apply_patch"}],
                    input=[
        {"type": "message", "role": "developer", "content": "rules"},
        {"role": "user", "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"}]},
        {"type": "reasoning", "id": "rs_x", "summary": [{"type": "summary_text", "text": "hmm"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "ok", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": '{"c":"ls"}'},
        {"type": "function_call", "call_id": "c2", "name": "sh", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA-foreign",
         "content": [{"type": "reasoning_text", "text": "raw"}]},
    ])
    assert request.messages == (
        Message("system", (Text("be brief"),)),
        Message("system", (Text("rules"),)),
        Message("user", (Text("look"), Image("data:image/png;base64,AA", "low"))),
        Message("assistant", (Reasoning("hmm"), Text("ok"), ToolCall("c1", "sh", '{"c":"ls"}'),
                              ToolCall("c2", "sh", "{}"))),
        Message("tool", (ToolResult("c1", (Text("a.txt"),)),)),
        Message("tool", (ToolResult("c2", (Text("b"),)),)),
        Message("assistant", (Reasoning("raw", encrypted="gAAAA-foreign"),)),
    )
    assert request.sampling.max_tokens == 64 and request.sampling.temperature == 0.5
    assert request.reasoning_effort == "high" and request.extra["reasoning"] == {"summary": "auto"}
    assert request.extra["previous_response_id"] == "resp_0" and request.extra["store"] is False
    assert request.tool_choice is not None and request.tool_choice.name == "sh"
    assert [t.name for t in request.tools] == ["sh"]
    assert request.extra["unmapped_tools"] == [{"type": "custom", "name": "apply_patch"}]


def test_string_input_is_one_user_message() -> None:
    assert parse(input="hi").messages == (Message("user", (Text("hi"),)),)


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"input": []}, "input", "at least one item"),
    ({"input": ""}, "input", "must not be empty"),
    ({}, "input", "got null"),
    ({"input": 3}, "input", "a string or an array"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "item_reference"),
    ({"input": ["hi"]}, "input[0]", "an object"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "'tool'"),
    ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
     "input[0].content[0].type", "input_file"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
     "input[0].content[0].image_url", "file_id"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
     "input[0].call_id", "got null"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]},
     "input[0].arguments", "a string"),
    ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name", "a string"),
    ({"input": "x", "tool_choice": "any"}, "tool_choice", "'auto'"),
    ({"input": "x", "max_output_tokens": "9"}, "max_output_tokens", "an integer"),
    ({"input": "x", "previous_response_id": 1}, "previous_response_id", "a string"),
    ({"input": "x", "instructions": ["a"]}, "instructions", "a string"),
])
def test_bad_input_names_the_field(body: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse(**body)
    assert caught.value.param == param and words in caught.value.message
    assert f"`{param}`" in caught.value.message


def test_with_previous_carries_history_and_replaces_instructions() -> None:
    first = parse(instructions="old", input="list files")
    reply = Completion("m", (Reasoning("think"), ToolCall("c1", "sh", "{}")), "tool_calls",
                       Usage(3, 4), NO_TOKENS)
    second = parse(instructions="new", previous_response_id="resp_1", input=[
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"}])
    merged = responses_request.with_previous(first, reply, second)
    assert merged.messages == (
        Message("system", (Text("new"),)),
        Message("user", (Text("list files"),)),
        Message("assistant", (Reasoning("think"), ToolCall("c1", "sh", "{}"))),
        Message("tool", (ToolResult("c1", (Text("a.txt"),)),)),
    )
    assert merged.extra == second.extra
    # Without current instructions, none carry over (as the Responses API does).
    third = parse(input="next")
    assert responses_request.with_previous(first, reply, third).messages[0].role == "user"


# ------------------------------------------------------------------ replies
COMPLETION = Completion("served", (Reasoning("think"), Text("Hi"),
                                   ToolCall("call_1", "bash", '{"command": "ls"}')),
                        "tool_calls", Usage(3, 5), Tokens((1,), (5,), (-0.5,)))
EVENTS = [
    Started("served", (1, 2, 3)),
    Chunk((ReasoningDelta("thi"),), (4,), (-0.5,)),
    Chunk((ReasoningDelta("nk"),), (5,), (-0.5,)),
    Chunk((TextDelta("Hi"),), (6,), (-0.25,)),
    Chunk((ToolCallDelta(0, "call_1", "bash", '{"comm'),), (7,), (-1.0,)),
    Chunk((ToolCallDelta(0, None, None, 'and": "ls"}'),), (8, 2), (-0.125, -0.0625)),
    Finished("tool_calls", Usage(3, 5)),
]


def encode_stream(events: list[Any] = EVENTS) -> bytes:
    encoder = responses.stream_encoder(parse(input="x", stream=True), CTX)
    return b"".join(encoder.feed(e) for e in events)


def decode(data: bytes) -> list[sse.SSEEvent]:
    decoder = sse.SSEDecoder()
    return decoder.feed(data) + decoder.finish()


def test_completion_rendering_matches_golden() -> None:
    body = responses.render_completion(COMPLETION, CTX)
    check_golden("openai_responses_completion.json", body)
    items = json.loads(body)["output"]
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call"]
    assert [i["id"] for i in items] == ["rs_1_0", "msg_1_1", "fc_1_2"]


def test_stream_encoding_matches_golden_and_is_well_formed() -> None:
    data = encode_stream()
    check_golden("openai_responses_stream.sse", data)
    events = decode(data)
    payloads = [json.loads(e.data) for e in events]
    assert [p["sequence_number"] for p in payloads] == list(range(len(events)))
    assert all(e.event == p["type"] for e, p in zip(events, payloads, strict=True))
    final = payloads[-1]["response"]
    assert payloads[-1]["type"] == "response.completed"
    assert final["output"] == json.loads(responses.render_completion(COMPLETION, CTX))["output"]


def test_length_finish_is_incomplete() -> None:
    done = Completion("m", (Text("cut"),), "length", Usage(1, 1), NO_TOKENS)
    body = json.loads(responses.render_completion(done, CTX))
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    last = decode(encode_stream([Started("m"), Chunk((TextDelta("cut"),)),
                                 Finished("length")]))[-1]
    assert last.event == "response.incomplete"


def transport_client(body: bytes, content_type: str) -> openai.OpenAI:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/responses"
        return httpx.Response(200, content=body, headers={"content-type": content_type})

    return openai.OpenAI(api_key="k", base_url="http://proxy/v1", max_retries=0,
                         http_client=httpx.Client(transport=httpx.MockTransport(answer)))


def test_openai_sdk_parses_the_completion() -> None:
    client = transport_client(responses.render_completion(COMPLETION, CTX), "application/json")
    response = client.responses.create(model="their-model", input="x")
    assert response.output_text == "Hi" and response.status == "completed"
    reasoning, _, call = response.output
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == "think"
    assert call.type == "function_call" and call.call_id == "call_1"
    assert call.arguments == '{"command": "ls"}' and call.name == "bash"
    assert response.usage is not None and response.usage.total_tokens == 8


def test_openai_sdk_parses_the_stream() -> None:
    client = transport_client(encode_stream(), "text/event-stream")
    events = list(client.responses.create(model="their-model", input="x", stream=True))
    assert events[0].type == "response.created"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas == ["Hi"]
    final = events[-1]
    assert final.type == "response.completed"
    assert final.response.output_text == "Hi"
    assert [o.type for o in final.response.output] == ["reasoning", "message", "function_call"]


def test_openai_sdk_stream_helper_accumulates() -> None:
    client = transport_client(encode_stream(), "text/event-stream")
    with client.responses.stream(model="their-model", input="x") as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.output_text == "Hi" and final.output[2].arguments == '{"command": "ls"}'


def test_mid_stream_error_fails_the_response_and_the_sdk_raises() -> None:
    encoder = responses.stream_encoder(parse(input="x"), CTX)
    data = encoder.feed(Started("m")) + encoder.feed(Chunk((TextDelta("par"),)))
    data += encoder.error(EngineUnavailable("the engine went away"))
    events = [json.loads(e.data) for e in decode(data)]
    failed = next(e for e in events if e["type"] == "response.failed")
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["message"] == "the engine went away"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    client = transport_client(data, "text/event-stream")
    with pytest.raises(openai.APIError, match="the engine went away"):
        list(client.responses.create(model="m", input="x", stream=True))


def test_error_shapes_and_models() -> None:
    status, body = responses.render_error(InvalidRequest("fix `x`", param="x"))
    assert status == 400 and json.loads(body) == {"error": {
        "message": "fix `x`", "type": "invalid_request_error", "param": "x", "code": None}}
    status, body = responses.render_error(NotFound("no such model", param="model"))
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
    assert json.loads(responses.render_models(["a"]))["data"][0]["id"] == "a"


# ------------------------------------------------------------------ properties
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=8))
def test_any_byte_split_decodes_to_the_same_events(cuts: list[int]) -> None:
    data = encode_stream()
    whole = decode(data)
    decoder, events, start = sse.SSEDecoder(), [], 0
    for cut in sorted(c % (len(data) + 1) for c in cuts):
        events += decoder.feed(data[start:cut])
        start = cut
    events += decoder.feed(data[start:]) + decoder.finish()
    assert events == whole


text = st.text(max_size=20)
reasoning = st.builds(Reasoning, text, st.none() | text, st.none() | text, st.booleans())
tool_call = st.builds(ToolCall, text, text, text)
assistant_parts = st.lists(st.one_of(st.builds(Text, text), reasoning, tool_call),
                           min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(assistant_parts)
def test_output_items_come_back_as_the_same_parts(parts: list[Any]) -> None:
    done = Completion("m", tuple(parts), "stop", None, NO_TOKENS)
    items = json.loads(responses.render_completion(done, CTX))["output"]
    request = parse(input=[{"role": "user", "content": "q"}, *items])
    assert request.messages[1:] == (Message("assistant", tuple(parts)),)


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=30))
def test_reasoning_without_encrypted_content_comes_back_by_summary(thought: str) -> None:
    done = Completion("m", (Reasoning(thought), Text("a")), "stop", None, NO_TOKENS)
    items = json.loads(responses.render_completion(done, CTX))["output"]
    del items[0]["encrypted_content"]
    request = parse(input=items)
    assert request.messages == (Message("assistant", (Reasoning(thought), Text("a"))),)


def test_streamed_items_come_back_as_the_streamed_parts() -> None:
    events = [json.loads(e.data) for e in decode(encode_stream())]
    items = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert parse(input=items).messages == (Message("assistant", COMPLETION.parts),)


def test_every_payload_validates_strictly_against_the_sdk_models() -> None:
    # The SDK builds its objects leniently; validating proves every required field is there.
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    Response.model_validate_json(responses.render_completion(COMPLETION, CTX))
    adapter = TypeAdapter(ResponseStreamEvent)
    encoder = responses.stream_encoder(parse(input="x"), CTX)
    failed = encoder.feed(Started("m")) + encoder.error(EngineUnavailable("gone"))
    for event in decode(encode_stream()) + decode(failed):
        adapter.validate_json(event.data)
