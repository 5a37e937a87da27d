"""Property-based fuzzing of the proxy (issue 8, item 3).

Malformed and adversarial request bodies for each dialect (valid bodies from the drivers and
from the harnesses' wire captures with random sub-values replaced by JSON of other types,
huge strings, deep nesting, invalid UTF-8, duplicate keys, NaN/Infinity literals, random
bytes), sent in-process through `httpx.ASGITransport`. Properties: the proxy never answers
a 5xx of its own making (an `internal` error is a bug), every error is in the dialect's
shape, and the proxy keeps serving. Then broken SSE from the engine: a clean error to the
client in its dialect and a failed turn.

The case counts per dialect are printed at the end of the module.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import json
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
from harnessrl.proxy.engines.vllm import VLLMEngine
from harnessrl.proxy.serve import in_thread
from tests.conftest import SHARED, make_proxy
from tests.fake_vllm import PROMPT_IDS

CASES: collections.Counter[tuple[str, str]] = collections.Counter()


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


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture(scope="module", autouse=True)
def report_counts(request) -> Iterator[None]:
    yield
    capture = request.config.pluginmanager.getplugin("capturemanager")
    lines = [f"  {test:<28} {dialect:<18} {n:>5} cases"
             for (test, dialect), n in sorted(CASES.items())]
    totals = collections.Counter()
    for (_test, dialect), n in CASES.items():
        totals[dialect] += n
    lines += [f"  {'total':<28} {dialect:<18} {n:>5} cases" for dialect, n in sorted(
        totals.items())]
    text = "\nfuzz cases run per dialect:\n" + "\n".join(lines)
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print(text, flush=True)


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

    def call(self, dialect: Dialect, content: bytes, *, stream: bool = False) -> httpx.Response:
        path = dialect.stream_path if stream else dialect.path
        params = {"alt": "sse"} if stream and dialect.name == "gemini" else None
        return self.post(f"/r/{self.key}{path}", content, params)


# ------------------------------------------------------------------ the dialects
def _openai_shape(status: int, body: Any) -> bool:
    return (isinstance(body, dict) and set(body) == {"error"}
            and isinstance(body["error"], dict)
            and set(body["error"]) == {"message", "type", "param", "code"}
            and isinstance(body["error"]["message"], str)
            and isinstance(body["error"]["type"], str))


def _anthropic_shape(status: int, body: Any) -> bool:
    return (isinstance(body, dict) and body.get("type") == "error"
            and isinstance(body.get("error"), dict)
            and set(body["error"]) == {"type", "message"}
            and isinstance(body["error"]["message"], str))


def _gemini_shape(status: int, body: Any) -> bool:
    return (isinstance(body, dict) and set(body) == {"error"}
            and isinstance(body["error"], dict)
            and set(body["error"]) == {"code", "message", "status"}
            and body["error"]["code"] == status and isinstance(body["error"]["status"], str))


def _internal(body: Any) -> bool:
    """The proxy's own fault, in any of the shapes."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return False
    return (err.get("type") == "server_error"
            or (err.get("type") == "api_error" and "internal proxy error" in str(
                err.get("message")))
            or "internal proxy error" in str(err.get("message")))


def _wire(paths: tuple[str, ...]) -> list[dict[str, Any]]:
    bodies = []
    for file in sorted((SHARED / "harnesses" / "wire").glob("*/*.json")):
        wire = json.loads(file.read_text())
        if any(wire["path"].startswith(p) for p in paths) and isinstance(wire["body"], dict):
            bodies.append(wire["body"])
    return bodies


SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}},
          "required": ["command"]}


@dataclass
class Dialect:
    name: str
    path: str
    stream_path: str
    good: dict[str, Any]
    seeds: list[dict[str, Any]]
    shape: Callable[[int, Any], bool]
    stream_error: bytes  # the marker of this dialect's error event in a stream
    last_event: bytes  # how the last event of a failed stream starts

    def body(self, *, stream: bool = False) -> bytes:
        """The good body; streamed by a flag in it, except Gemini (by its path)."""
        good = {**self.good, "stream": True} if stream and self.name != "gemini" else self.good
        return json.dumps(good).encode()


CHAT_GOOD = {"model": "m", "messages": [{"role": "user", "content": "make hello.txt"}],
             "tools": [{"type": "function", "function": {"name": "bash",
                                                         "parameters": SCHEMA}}]}
ANTHROPIC_GOOD = {"model": "claude", "max_tokens": 256,
                  "messages": [{"role": "user", "content": "make hello.txt"}],
                  "tools": [{"name": "bash", "input_schema": SCHEMA}]}
RESPONSES_GOOD = {"model": "codex", "store": False, "include": ["reasoning.encrypted_content"],
                  "input": [{"type": "message", "role": "user", "content": "make hello.txt"}],
                  "tools": [{"type": "function", "name": "bash", "parameters": SCHEMA}]}
GEMINI_GOOD = {"contents": [{"role": "user", "parts": [{"text": "make hello.txt"}]}],
               "tools": [{"functionDeclarations": [{"name": "bash",
                                                    "parametersJsonSchema": SCHEMA}]}]}

DIALECTS = [
    Dialect("openai_chat", "/v1/chat/completions", "/v1/chat/completions", CHAT_GOOD,
            [CHAT_GOOD, *_wire(("/v1/chat/completions", "/chat/completions"))],
            _openai_shape, b'data: {"error":', b'data: {"error":'),
    Dialect("anthropic", "/v1/messages", "/v1/messages", ANTHROPIC_GOOD,
            [ANTHROPIC_GOOD, *_wire(("/v1/messages",))], _anthropic_shape,
            b"event: error\n", b"event: error\n"),
    Dialect("openai_responses", "/v1/responses", "/v1/responses", RESPONSES_GOOD,
            [RESPONSES_GOOD, *_wire(("/v1/responses",))], _openai_shape,
            b"event: response.failed\n", b"event: error\n"),
    Dialect("gemini", "/v1beta/models/gemini-x:generateContent",
            "/v1beta/models/gemini-x:streamGenerateContent", GEMINI_GOOD,
            [GEMINI_GOOD, *_wire(("/v1beta/models",))], _gemini_shape, b'data: {"error":',
            b'data: {"error":'),
]
IDS = [d.name for d in DIALECTS]


def check_answer(dialect: Dialect, resp: httpx.Response, sent: bytes) -> None:
    """The properties every answer must have, whatever was sent."""
    status = resp.status_code
    assert status < 500, f"{dialect.name}: {status} {resp.text[:500]} for {sent[:300]!r}"
    if status == 200:
        # A stream (the body kept `stream: true`) must not have failed on our side either.
        assert b"internal proxy error" not in resp.content, (sent[:300], resp.content[-500:])
        return
    body = resp.json()
    assert dialect.shape(status, body), f"{dialect.name}: bad error shape {body} for {sent!r:.300}"
    assert not _internal(body), f"{dialect.name}: internal error {body} for {sent!r:.300}"


def still_serves(served: InProcess, dialect: Dialect) -> None:
    resp = served.call(dialect, dialect.body())
    assert resp.status_code == 200, resp.text


@pytest.fixture(scope="module")
def served(tokenizer, loop: LoopThread, tmp_path_factory) -> Iterator[InProcess]:
    engine = ScriptedEngine(tokenizer, replay(["Hello there.", "<think>\nhm\n</think>\n\nok"]),
                            model="scripted")
    proxy = make_proxy(engine, tmp_path_factory.mktemp("fuzz"))
    with InProcess(proxy, loop) as served:
        yield served


# ------------------------------------------------------------------ strategies
_leaves = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
           | st.sampled_from(["", "user", "assistant", "tool", "system", "function",
                              "text", "image", "tool_use", "tool_result", "message",
                              "function_call", "function_call_output", "model"]))
json_values = st.recursive(
    _leaves, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)
Path_ = tuple[str | int, ...]


def paths(value: Any, prefix: Path_ = ()) -> Iterator[Path_]:
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, (*prefix, index))


def _get(body: Any, path: Path_) -> Any:
    for step in path:
        body = body[step]
    return body


def _set(body: Any, path: Path_, value: Any) -> Any:
    if not path:
        return value
    _get(body, path[:-1])[path[-1]] = value
    return body


def _delete(body: Any, path: Path_) -> Any:
    if path:
        parent = _get(body, path[:-1])
        del parent[path[-1]]
    return body


def _same_type(a: Any, b: Any) -> bool:
    kinds = (bool, (int, float), str, list, dict, type(None))
    return any(isinstance(a, k) and isinstance(b, k) for k in kinds) and (
        isinstance(a, bool) == isinstance(b, bool))


@st.composite
def mutated(draw: st.DrawFn, seeds: list[dict[str, Any]], stream: bool = False
            ) -> dict[str, Any]:
    """A valid body with 1-4 sub-values replaced by JSON of another type, deleted, or
    given a random extra key."""
    body = copy.deepcopy(draw(st.sampled_from(seeds)))
    if stream and "contents" not in body:  # Gemini streams by its path
        body["stream"] = True
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.sampled_from(list(paths(body))))
        op = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add"]))
        if op == "delete" and where:
            body = _delete(body, where)
        elif op == "add" and isinstance(_get(body, where), dict):
            _get(body, where)[draw(st.text(max_size=12))] = draw(json_values)
        else:
            old = _get(body, where)
            new = draw(json_values.filter(lambda v, old=old: not _same_type(v, old)))
            body = _set(body, where, new)
    return body


_PLACE = "\u0000PLACEHOLDER\u0000"
_PLACE_BYTES = json.dumps(_PLACE).encode()


@st.composite
def with_raw(draw: st.DrawFn, seeds: list[dict[str, Any]], raws: st.SearchStrategy[bytes]
             ) -> bytes:
    """A seed body serialized with one sub-value (or the whole) replaced by raw JSON text,
    so bytes JSON itself cannot hold (invalid UTF-8, NaN, nesting) can be planted."""
    body = copy.deepcopy(draw(st.sampled_from(seeds)))
    where = draw(st.sampled_from(list(paths(body))))
    body = _set(body, where, _PLACE)
    return json.dumps(body).encode().replace(_PLACE_BYTES, draw(raws), 1)


def nested(depth: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


_BAD_UTF8 = [b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xa0\xa1", b"\xe2\x28\xa1", b"\xf0\x28\x8c\xbc",
             b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\xa1\xa1\xa1\xa1", b"\x80"]
invalid_utf8 = st.builds(lambda pre, bad, post: b'"' + pre + bad + post + b'"',
                         st.sampled_from([b"", b"abc", "h\u00e9".encode()]),
                         st.sampled_from(_BAD_UTF8), st.sampled_from([b"", b"xyz"]))
lone_surrogates = st.sampled_from([b'"\\ud800"', b'"a\\udfffb"', b'"\\udc00\\ud800"'])
number_literals = st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"nan", b"inf",
                                   b"1e999", b"-1e999", b"1e-999", b"-0", b"0.0e0",
                                   b"123456789012345678901234567890", b"-9223372036854775809",
                                   b"18446744073709551616", b"01", b"1.", b"+1", b".5"])
moderate_nesting = st.builds(nested, st.integers(1, 400), st.sampled_from(["list", "dict"]))


@st.composite
def huge_string(draw: st.DrawFn, seeds: list[dict[str, Any]]) -> bytes:
    """A string leaf (or a new one) of at least 1 MiB; the body stays under the limit."""
    body = copy.deepcopy(draw(st.sampled_from(seeds)))
    strings = [p for p in paths(body) if isinstance(_get(body, p), str)]
    size = draw(st.integers(1 << 20, (1 << 20) + 4096))
    unit = draw(st.sampled_from(["lorem ipsum dolor ", "\u00e9\u4e2d\U0001f600 ", "x", "\\n"]))
    text = (unit * (size // len(unit) + 1))[:size]
    where = draw(st.sampled_from(strings)) if strings else ("huge",)
    if not strings:
        body["huge"] = ""
    body = _set(body, where, text)
    return json.dumps(body).encode()


@st.composite
def duplicate_keys(draw: st.DrawFn, seeds: list[dict[str, Any]]) -> bytes:
    """A top-level key given twice: first or last the wrong type."""
    body = draw(st.sampled_from(seeds))
    key = draw(st.sampled_from(sorted(body)))
    other = json.dumps(draw(json_values)).encode()
    rest = json.dumps(body).encode()
    head = b"{" + json.dumps(key).encode() + b": " + other
    if draw(st.booleans()):
        return head + b", " + rest[1:]
    return rest[:-1] + b", " + head[1:] + b"}"


@st.composite
def truncated(draw: st.DrawFn, seeds: list[dict[str, Any]]) -> bytes:
    raw = json.dumps(draw(st.sampled_from(seeds))).encode()
    return raw[:draw(st.integers(0, len(raw) - 1))]


def adversarial(seeds: list[dict[str, Any]]) -> st.SearchStrategy[bytes]:
    return st.one_of(
        with_raw(seeds, invalid_utf8 | lone_surrogates | number_literals | moderate_nesting),
        duplicate_keys(seeds), truncated(seeds), st.binary(max_size=512),
        st.binary(max_size=64).map(lambda b: b"{" + b),
        st.sampled_from([b"null", b"[]", b"{}", b"1", b'"s"', b"true", b"\xef\xbb\xbf{}",
                         b"{}" * 2, b" ", b"\x00"]),
    )


# ------------------------------------------------------------------ properties
@pytest.mark.parametrize("dialect", DIALECTS, ids=IDS)
def test_mutated_bodies_never_5xx_and_keep_the_error_shape(served, dialect: Dialect) -> None:
    @fuzz(250)
    @given(data=st.data(), stream=st.booleans())
    def run(data: st.DataObject, stream: bool) -> None:
        CASES["mutated", dialect.name] += 1
        raw = json.dumps(data.draw(mutated(dialect.seeds, stream))).encode()
        check_answer(dialect, served.call(dialect, raw, stream=stream), raw)

    run()
    still_serves(served, dialect)


@pytest.mark.parametrize("dialect", DIALECTS, ids=IDS)
def test_adversarial_bytes_never_5xx_and_keep_the_error_shape(served, dialect: Dialect) -> None:
    seeds = dialect.seeds + [{**b, "stream": True} for b in dialect.seeds if "contents" not in b]

    @fuzz(200)
    @given(raw=adversarial(seeds), stream=st.booleans())
    def run(raw: bytes, stream: bool) -> None:
        CASES["adversarial", dialect.name] += 1
        check_answer(dialect, served.call(dialect, raw, stream=stream), raw)
        still_serves(served, dialect)

    run()


@pytest.mark.parametrize("dialect", DIALECTS, ids=IDS)
def test_huge_strings_are_served_or_refused_cleanly(served, dialect: Dialect) -> None:
    @fuzz(3)
    @given(raw=huge_string(dialect.seeds))
    def run(raw: bytes) -> None:
        CASES["huge_string", dialect.name] += 1
        assert len(raw) >= 1 << 20
        check_answer(dialect, served.call(dialect, raw), raw)

    run()
    still_serves(served, dialect)


def test_deep_nesting_up_to_the_decoder_limit_is_served(served) -> None:
    """Nesting the decoder accepts (a few hundred levels) goes through every dialect."""
    for dialect in DIALECTS:
        for depth in (100, 400, 900):
            raw = json.dumps({**dialect.good, "x": _PLACE}).encode().replace(
                _PLACE_BYTES, nested(depth, "list"))
            CASES["deep_nesting", dialect.name] += 1
            check_answer(dialect, served.call(dialect, raw), raw)


# ------------------------------------------------------------------ bugs this fuzzing found
# Each answered 500 until fixed; kept as regressions.
def _with(dialect: str, raw_value: bytes, **fields: Any) -> tuple[Dialect, bytes]:
    d = next(x for x in DIALECTS if x.name == dialect)
    body = {**d.good, **fields}
    return d, json.dumps(body).encode().replace(_PLACE_BYTES, raw_value)


_USER = {"role": "user", "content": "hi"}
BUGS = {
    # msgspec raises RecursionError (not DecodeError) past ~1000 levels, in every dialect.
    **{f"deep_nesting_{d.name}": (d.name, nested(10_000, "list"), {"x": _PLACE})
       for d in DIALECTS},
    "chat_role_list": ("openai_chat", b"[]", {"messages": [{"role": _PLACE, "content": "x"}]}),
    "responses_item_type_list": ("openai_responses", b"[]",
                                 {"input": [{"type": _PLACE, "role": "user", "content": "x"}]}),
    "responses_role_list": ("openai_responses", b"[]",
                            {"input": [{"type": "message", "role": _PLACE, "content": "x"}]}),
    "anthropic_role_list": ("anthropic", b"[]", {"messages": [{"role": _PLACE, "content": "x"}]}),
    "anthropic_block_type_object": ("anthropic", b"{}", {"messages": [
        {"role": "user", "content": [{"type": _PLACE, "text": "x"}]}]}),
    "anthropic_tool_choice_type_list": ("anthropic", b"[]", {"tool_choice": {"type": _PLACE}}),
    "anthropic_effort_list": ("anthropic", b"[]", {"output_config": {"effort": _PLACE}}),
    "gemini_empty_parts": ("gemini", b"[]", {"contents": [{"role": "user", "parts": _PLACE}],
                                            "tools": []}),
}
@pytest.mark.parametrize("name", list(BUGS))
def test_found_bug_is_a_client_error(served, name: str) -> None:
    dialect_name, raw_value, fields = BUGS[name]
    dialect, raw = _with(dialect_name, raw_value, **fields)
    resp = served.call(dialect, raw)
    still_serves(served, dialect)
    assert resp.status_code < 500, resp.text
    # A bad effort value is only recorded (200); every other case is a 4xx in shape.
    assert resp.status_code == 200 or dialect.shape(resp.status_code, resp.json())


# ------------------------------------------------------------------ broken SSE from the engine
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
        script = _good_stream() if self.ok else list(self.script)

        async def stream():
            for piece in script:
                yield piece
                await asyncio.sleep(0)

        if not body.get("stream"):
            return Response(b"".join(script), media_type="application/json")
        return StreamingResponse(stream(), media_type="text/event-stream")


def _chunk(text: str, token: int, finish: str | None = None) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion.chunk", "model": "fake", "choices": [{
        "index": 0, "delta": {"content": text}, "finish_reason": finish, "token_ids": [token],
        "logprobs": {"content": [{"token": text, "logprob": -0.5}]}}]}


_FIRST = {"id": "x", "object": "chat.completion.chunk", "model": "fake",
          "prompt_token_ids": PROMPT_IDS,
          "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                       "token_ids": [], "logprobs": None}]}


def _sse(body: Any) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _good_stream() -> list[bytes]:
    return [_sse(_FIRST), _sse(_chunk("Hi", 10)), _sse(_chunk("", 11, "stop")),
            b"data: [DONE]\n\n"]


_frames = st.one_of(
    st.builds(lambda t, i: _sse(_chunk(t, i)), st.text(max_size=8), st.integers(0, 1000)),
    st.builds(lambda b, n: _sse(b)[:n], st.just(_chunk("cut", 5)), st.integers(6, 60)),
    st.binary(max_size=64),
    st.builds(lambda v: b"data: " + json.dumps(v).encode() + b"\n\n", json_values),
    st.sampled_from([b"data: {\"choices\": 5}\n\n", b"data: null\n\n", b"data: \n\n",
                     b"data: {\"error\": {\"message\": \"boom\"}}\n\n", b"\xff\xfe\n\n",
                     b": keep-alive\n\n", b"event: x\n", b"data: [DONE]\n\n",
                     b"data: {\"choices\": [{\"token_ids\": [\"a\"]}]}\n\n",
                     b"data: {\"choices\": [{\"logprobs\": {\"content\": [{}]}}]}\n\n",
                     b"data: {\"prompt_token_ids\": -1}\n\n"]),
)


@pytest.fixture(scope="module")
def broken(loop: LoopThread, tmp_path_factory) -> Iterator[tuple[BrokenVLLM, InProcess]]:
    fake = BrokenVLLM()
    with in_thread(fake.app()) as (url, _server):
        proxy = make_proxy(VLLMEngine(url, read_timeout=10), tmp_path_factory.mktemp("broken"))
        with InProcess(proxy, loop) as served:
            yield fake, served


@pytest.mark.parametrize("dialect", DIALECTS, ids=IDS)
def test_broken_engine_stream_is_a_clean_error_and_a_failed_turn(broken, dialect: Dialect
                                                                 ) -> None:
    fake, served = broken

    @fuzz(60)
    @given(head=st.booleans(), frames=st.lists(_frames, max_size=6))
    def run(head: bool, frames: list[bytes]) -> None:
        CASES["broken_engine_sse", dialect.name] += 1
        script = ([_sse(_FIRST)] if head else []) + frames  # no finish_reason, ever
        fake.script = script
        before = len(served.store.turns(served.key))
        resp = served.call(dialect, dialect.body(stream=True), stream=True)
        turns = served.store.turns(served.key)
        assert len(turns) == before + 1
        turn = turns[-1]
        assert turn.status == "failed", (script, resp.content)
        assert "internal" not in (turn.error or ""), (script, turn.error)
        if resp.status_code == 200:
            # Opened, then broken: the stream ends on the dialect's error event.
            assert dialect.stream_error in resp.content, (script, resp.content)
            last = resp.content.rstrip().rsplit(b"\n\n", 1)[-1]
            assert last.startswith(dialect.last_event), (script, resp.content)
            assert b"internal proxy error" not in last, (script, last)
        else:
            assert resp.status_code in (502, 503, 504), (script, resp.text)
            body = resp.json()
            assert dialect.shape(resp.status_code, body) and not _internal(body), body
        fake.ok = True
        try:
            good = served.call(dialect, dialect.body(stream=True), stream=True)
            assert good.status_code == 200 and dialect.stream_error not in good.content
            assert served.store.turns(served.key)[-1].status == "ok"
        finally:
            fake.ok = False

    run()
