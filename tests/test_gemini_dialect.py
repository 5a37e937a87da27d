"""The Gemini dialect as pure functions: real Gemini CLI requests parse; replies render to
golden wire bytes that the official `google-genai` SDK reads; what the proxy emits parses
back to the same canonical parts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.errors import EngineUnavailable, InvalidRequest, NotFound
from harnessrl.proxy.dialects import gemini, gemini_request
from harnessrl.proxy.dialects.base import ReplyContext
from harnessrl.proxy.wire import sse
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

GOLDEN = Path(__file__).parent / "golden"
CTX = ReplyContext("resp-1", 1700000000, "their-model")
SIG = "c2lnbmF0dXJlLWZyb20tZWxzZXdoZXJl"  # a foreign signature: must pass through


def check_golden(name: str, data: bytes) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_bytes(data)
    assert data == path.read_bytes()


# ------------------------------------------------------------------ real requests
@pytest.mark.parametrize("path", recorded_requests("gemini"), ids=lambda p: p.name)
def test_real_gemini_cli_requests_parse(path: Path) -> None:
    wire = json.loads(path.read_text())
    body = wire["body"]
    request = gemini.parse_request(body, model="dummy-model", stream=True)
    assert request.model == "dummy-model" and request.stream
    assert request.messages[0].role == "system"
    assert len(request.messages) == 1 + len(body["contents"])
    decls = [d for t in body["tools"] for d in t.get("functionDeclarations", [])]
    assert [t.name for t in request.tools] == [d["name"] for d in decls]
    for tool, decl in zip(request.tools, decls, strict=True):
        assert tool.parameters == decl["parametersJsonSchema"]  # passed through unchanged
    assert "schema_changes" not in request.extra
    config = body["generationConfig"]
    assert request.sampling.temperature == config["temperature"]
    assert request.sampling.top_k == config["topK"]
    assert request.extra["thinkingConfig"] == config["thinkingConfig"]
    for key in set(body) - gemini_request._MAPPED:
        assert request.extra[key] == body[key]


# ------------------------------------------------------------------ every part kind
def full_request() -> dict[str, Any]:
    return {
        "systemInstruction": {"parts": [{"text": "rules"}]},
        "contents": [
            {"role": "user", "parts": [
                {"text": "look"}, {"inlineData": {"mimeType": "image/png", "data": "AAAA"}},
                {"fileData": {"mimeType": "image/jpeg", "fileUri": "gs://b/x.jpg"}}]},
            {"role": "model", "parts": [
                {"text": "hmm", "thought": True, "thoughtSignature": SIG},
                {"functionCall": {"name": "ls", "args": {"dir": "."}},
                 "thoughtSignature": "c2ln"},
                {"functionCall": {"name": "ls", "args": {"dir": "/"}}},
                {"functionCall": {"name": "cat", "args": {}, "id": "given"}}]},
            {"role": "user", "parts": [
                {"functionResponse": {"name": "ls", "response": {"output": "a"}}},
                {"functionResponse": {"name": "ls", "response": {"error": "denied"}}},
                {"functionResponse": {"name": "cat", "id": "given", "response": {"o": 1}}},
                {"text": "go on"}]},
        ],
        "tools": [{"functionDeclarations": [{"name": "ls", "parameters": {
            "type": "OBJECT", "required": ["dir"], "properties": {
                "dir": {"type": "STRING", "nullable": True, "example": "."},
                "mode": {"type": "STRING", "enum": ["a", "b"], "nullable": True},
                "tags": {"type": "ARRAY", "maxItems": "3", "items": {"type": "INTEGER"}}}}}]},
            {"googleSearch": {}}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["ls"]}},
        "generationConfig": {"temperature": 0.5, "topP": 0.9, "topK": 40,
                             "maxOutputTokens": 100, "stopSequences": ["END"], "seed": 7,
                             "presencePenalty": 0.1, "frequencyPenalty": 0.2,
                             "candidateCount": 1, "responseMimeType": "text/plain",
                             "thinkingConfig": {"thinkingLevel": "HIGH"}},
        "safetySettings": [{"category": "X", "threshold": "BLOCK_NONE"}],
    }


def test_every_part_kind_and_an_openapi_schema() -> None:
    request = gemini.parse_request(full_request(), model="m", stream=False)
    system, user, model, r1, r2, r3, user2 = request.messages
    assert system == Message("system", (Text("rules"),))
    assert user.parts == (Text("look"), Image("data:image/png;base64,AAAA"),
                          Image("gs://b/x.jpg"))
    assert model.parts == (Reasoning("hmm", SIG), Reasoning("", "c2ln"),
                           ToolCall("ls_0", "ls", '{"dir": "."}'),
                           ToolCall("ls_1", "ls", '{"dir": "/"}'), ToolCall("given", "cat", "{}"))
    assert r1.parts == (ToolResult("ls_0", (Text('{"output": "a"}'),)),)
    assert r2.parts == (ToolResult("ls_1", (Text('{"error": "denied"}'),), is_error=True),)
    assert r3.parts == (ToolResult("given", (Text('{"o": 1}'),)),)
    assert user2 == Message("user", (Text("go on"),))
    assert request.tools[0].parameters == {
        "type": "object", "required": ["dir"], "properties": {
            "dir": {"type": ["string", "null"], "examples": ["."]},
            "mode": {"type": ["string", "null"], "enum": ["a", "b", None]},
            "tags": {"type": "array", "maxItems": 3, "items": {"type": "integer"}}}}
    where = "tools[0].functionDeclarations[0].parameters"
    assert request.extra["schema_changes"] == [
        f"{where}.type: OBJECT -> object",
        f"{where}.properties.dir.type: STRING -> string",
        f"{where}.properties.dir.example -> examples",
        f"{where}.properties.dir.nullable: type string -> [string, null]",
        f"{where}.properties.mode.type: STRING -> string",
        f"{where}.properties.mode.nullable: type string -> [string, null]",
        f"{where}.properties.mode.nullable: enum += null",
        f"{where}.properties.tags.type: ARRAY -> array",
        f"{where}.properties.tags.maxItems: string '3' -> integer",
        f"{where}.properties.tags.items.type: INTEGER -> integer",
    ]
    assert request.extra["unmapped_tools"] == [{"googleSearch": {}}]
    assert request.tool_choice == ToolChoice("required", "ls")
    s = request.sampling
    assert (s.temperature, s.top_p, s.top_k, s.max_tokens, s.stop, s.seed) == (
        0.5, 0.9, 40, 100, ("END",), 7)
    assert (s.presence_penalty, s.frequency_penalty) == (0.1, 0.2)
    assert request.reasoning_effort == "high"
    assert request.extra["generationConfig"] == {"responseMimeType": "text/plain"}
    assert request.extra["safetySettings"] == full_request()["safetySettings"]


BAD = [
    ({"contents": []}, "contents", "at least one"),
    ({}, "contents", "must be an array"),
    ({"contents": [{"role": "user", "parts": [{"executableCode": {}}]}]},
     "contents[0].parts[0]", "executableCode"),
    ({"contents": [{"role": "user", "parts": [{"text": 1}]}]},
     "contents[0].parts[0].text", "must be a string"),
    ({"contents": [{"role": "bot", "parts": []}]}, "contents[0].role", "'user' or 'model'"),
    ({"contents": [{"role": ["user"], "parts": []}]}, "contents[0].role", "'user' or 'model'"),
    ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"candidateCount": 2}},
     "generationConfig.candidateCount", "must be 1"),
    ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"topK": "5"}},
     "generationConfig.topK", "must be a number"),
    ({"contents": [{"parts": [{"functionResponse": {"name": "ls", "response": {}}}]}]},
     "contents[0].parts[0].functionResponse", "never made"),
    ({"contents": [{"parts": [{"functionCall": {"name": "ls"}}]}]},
     "contents[0].parts[0]", "'model' content"),
    ({"contents": [{"parts": [{"text": "x"}]}],
      "toolConfig": {"functionCallingConfig": {"mode": "SOMETIMES"}}},
     "toolConfig.functionCallingConfig.mode", "must be one of"),
]


@pytest.mark.parametrize(("body", "param", "words"), BAD, ids=[b[1] for b in BAD])
def test_bad_input_names_the_field(body: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        gemini.parse_request(body, model="m", stream=False)
    assert caught.value.param == param and words in caught.value.message


def test_error_shapes() -> None:
    status, body = gemini.render_error(InvalidRequest("fix `x`", param="x"))
    assert status == 400 and json.loads(body) == {"error": {
        "code": 400, "message": "fix `x`", "status": "INVALID_ARGUMENT"}}
    assert json.loads(gemini.render_error(NotFound("no model"))[1])["error"]["status"] == \
        "NOT_FOUND"
    assert gemini.render_error(EngineUnavailable("down"))[0] == 503


def test_models_and_count_tokens() -> None:
    models = json.loads(gemini.render_models(["a"]))["models"]
    assert models[0]["name"] == "models/a" and "countTokens" in \
        models[0]["supportedGenerationMethods"]
    assert json.loads(gemini.count_tokens_body(12)) == {"totalTokens": 12}


# ------------------------------------------------------------------ golden replies
EVENTS = [
    Started("served", (1, 2, 3)),
    Chunk((ReasoningDelta("think"),), (5,), (-0.5,)),
    Chunk((TextDelta("Hi"),), (6,), (-0.25,)),
    Chunk((ToolCallDelta(0, "call_1", "bash", '{"comm'),), (7,), (-1.0,)),
    Chunk((ToolCallDelta(0, None, None, 'and": "ls"}'),), (8,), (-0.125,)),
    Chunk((ToolCallDelta(1, "call_2", "read", '{"path": "a"}'),), (9,), (-0.5,)),
    Finished("tool_calls", Usage(3, 6)),
]
COMPLETION = Completion("served", (Reasoning("think"), Text("Hi"),
                                   ToolCall("call_1", "bash", '{"command": "ls"}')),
                        "tool_calls", Usage(3, 5), Tokens((1,), (5,), (-0.5,)))


def encode_stream(*, use_sse: bool = True) -> bytes:
    request = gemini.parse_request({"contents": [{"parts": [{"text": "x"}]}]},
                                   model="their-model", stream=True)
    encoder = gemini.stream_encoder(request, CTX, sse=use_sse)
    return b"".join(encoder.feed(e) for e in EVENTS)


def test_completion_rendering_matches_golden() -> None:
    check_golden("gemini_completion.json", gemini.render_completion(COMPLETION, CTX))


def test_stream_encoding_matches_golden() -> None:
    data = encode_stream()
    check_golden("gemini_stream.sse", data)
    assert b"event:" not in data
    chunks = [json.loads(e.data) for e in decode(data)]
    # A function call arrives whole, in one chunk; the last chunk finishes with usage.
    calls = [p["functionCall"] for c in chunks for p in c["candidates"][0]["content"]["parts"]
             if "functionCall" in p]
    assert calls == [{"name": "bash", "args": {"command": "ls"}, "id": "call_1"},
                     {"name": "read", "args": {"path": "a"}, "id": "call_2"}]
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    assert chunks[-1]["usageMetadata"]["totalTokenCount"] == 9


def test_json_array_stream_is_one_array_of_the_same_chunks() -> None:
    array = json.loads(encode_stream(use_sse=False))
    assert array == [json.loads(e.data) for e in decode(encode_stream())]


def test_stream_error_is_a_final_gemini_error() -> None:
    encoder = gemini.stream_encoder(gemini.parse_request(
        {"contents": [{"parts": [{"text": "x"}]}]}, model="m", stream=True), CTX, sse=False)
    data = encoder.feed(Chunk((TextDelta("a"),))) + encoder.error(EngineUnavailable("down"))
    assert json.loads(data)[-1] == {"error": {"code": 503, "message": "down",
                                              "status": "UNAVAILABLE"}}


def decode(data: bytes) -> list[sse.SSEEvent]:
    decoder = sse.SSEDecoder()
    return decoder.feed(data) + decoder.finish()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0), max_size=8))
def test_any_byte_split_decodes_the_same(cuts: list[int]) -> None:
    data = encode_stream()
    points = sorted({c % (len(data) + 1) for c in cuts})
    decoder = sse.SSEDecoder()
    events: list[sse.SSEEvent] = []
    for start, end in zip([0, *points], [*points, len(data)], strict=True):
        events.extend(decoder.feed(data[start:end]))
    assert events + decoder.finish() == decode(data)


# ------------------------------------------------------------------ round trip
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=6)
arguments = st.one_of(
    st.just(""),
    st.dictionaries(st.text(max_size=6), json_values, max_size=3).map(
        lambda d: json.dumps(d, ensure_ascii=False)))
signatures = st.none() | st.text(min_size=1, max_size=12).filter(
    lambda s: s != gemini.OWN_SIGNATURE)
parts = st.one_of(
    st.builds(Text, st.text(max_size=10)),
    st.builds(Reasoning, st.text(max_size=10), signatures),
    st.builds(ToolCall, st.text(max_size=6), st.text(min_size=1, max_size=6), arguments),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(parts, min_size=1, max_size=6))
def test_what_the_proxy_emits_parses_back_to_the_same_parts(sampled: list[Any]) -> None:
    completion = Completion("m", tuple(sampled), "stop", None, Tokens(None, None, None))
    content = json.loads(gemini.render_completion(completion, CTX))["candidates"][0]["content"]
    body = {"contents": [{"role": "user", "parts": [{"text": "q"}]}, content]}
    request = gemini.parse_request(json.loads(json.dumps(body)), model="m", stream=False)
    assert request.messages[-1] == Message("assistant", tuple(sampled))


def test_a_signature_on_a_call_is_carried_on_that_call() -> None:
    parts = (Reasoning("", SIG), ToolCall("c", "ls", "{}"), Reasoning("why"),
             ToolCall("d", "ls", "[1]"))
    completion = Completion("m", parts, "tool_calls", None, Tokens(None, None, None))
    rendered = json.loads(gemini.render_completion(completion, CTX))["candidates"][0]
    assert rendered["content"]["parts"] == [
        {"functionCall": {"name": "ls", "args": {}, "id": "c"}, "thoughtSignature": SIG},
        {"text": "why", "thought": True, "thoughtSignature": gemini.OWN_SIGNATURE},
        {"functionCall": {"name": "ls", "id": "d"}},  # not an object: sent without args
    ]
    assert rendered["finishReason"] == "STOP"


# ------------------------------------------------------------------ the official SDK
def sdk_client(reply: bytes, content_type: str):
    from google import genai
    from google.genai import types

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=reply, headers={"content-type": content_type})

    http = httpx.Client(transport=httpx.MockTransport(handler))
    return genai.Client(api_key="k", http_options=types.HttpOptions(
        base_url="http://proxy.test", httpx_client=http))


def test_sdk_reads_the_rendered_completion() -> None:
    client = sdk_client(gemini.render_completion(COMPLETION, CTX), "application/json")
    response = client.models.generate_content(model="their-model", contents="x")
    parts = response.candidates[0].content.parts
    assert parts[0].thought and parts[0].text == "think"
    assert parts[0].thought_signature == b"harnessrl/reasoning/1"
    assert parts[1].text == "Hi"
    call = response.function_calls[0]
    assert (call.id, call.name, call.args) == ("call_1", "bash", {"command": "ls"})
    assert response.usage_metadata.total_token_count == 8
    assert response.response_id == "resp-1" and response.model_version == "their-model"


def test_sdk_reads_the_stream() -> None:
    client = sdk_client(encode_stream(), "text/event-stream")
    chunks = list(client.models.generate_content_stream(model="their-model", contents="x"))
    parts = [p for c in chunks for p in c.candidates[0].content.parts or []]
    assert [p.text for p in parts if p.thought] == ["think"]
    assert [p.text for p in parts if p.text and not p.thought] == ["Hi"]
    assert [(p.function_call.name, p.function_call.args) for p in parts if p.function_call] \
        == [("bash", {"command": "ls"}), ("read", {"path": "a"})]
    assert chunks[-1].candidates[0].finish_reason == "STOP"
    assert chunks[-1].usage_metadata.prompt_token_count == 3
