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

import collections
import contextlib
import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
from harnessrl.proxy.engines.vllm import VLLMEngine
from harnessrl.proxy.serve import in_thread
from harnessrl.proxy.wire.nesting import MAX_DEPTH
from tests.conftest import make_proxy
from tests.dialects import BY_NAME, IDS, WIRE, WireDialect
from tests.fuzzing import (
    FIRST_CHUNK,
    PLACE,
    PLACE_BYTES,
    SEEDS,
    BrokenVLLM,
    InProcess,
    LoopThread,
    chat_chunk,
    check_answer,
    delete_at,
    fuzz,
    get_at,
    internal_error,
    nested,
    paths,
    set_at,
    sse_frame,
)

CASES: collections.Counter[tuple[str, str]] = collections.Counter()


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


def still_serves(served: InProcess, dialect: WireDialect) -> None:
    resp = served.call(dialect, dialect.good_bytes())
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
            body = delete_at(body, where)
        elif op == "add" and isinstance(get_at(body, where), dict):
            get_at(body, where)[draw(st.text(max_size=12))] = draw(json_values)
        else:
            old = get_at(body, where)
            new = draw(json_values.filter(lambda v, old=old: not _same_type(v, old)))
            body = set_at(body, where, new)
    return body


@st.composite
def with_raw(draw: st.DrawFn, seeds: list[dict[str, Any]], raws: st.SearchStrategy[bytes]
             ) -> bytes:
    """A seed body serialized with one sub-value (or the whole) replaced by raw JSON text,
    so bytes JSON itself cannot hold (invalid UTF-8, NaN, nesting) can be planted."""
    body = copy.deepcopy(draw(st.sampled_from(seeds)))
    where = draw(st.sampled_from(list(paths(body))))
    body = set_at(body, where, PLACE)
    return json.dumps(body).encode().replace(PLACE_BYTES, draw(raws), 1)


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
    strings = [p for p in paths(body) if isinstance(get_at(body, p), str)]
    size = draw(st.integers(1 << 20, (1 << 20) + 4096))
    unit = draw(st.sampled_from(["lorem ipsum dolor ", "\u00e9\u4e2d\U0001f600 ", "x", "\\n"]))
    text = (unit * (size // len(unit) + 1))[:size]
    where = draw(st.sampled_from(strings)) if strings else ("huge",)
    if not strings:
        body["huge"] = ""
    body = set_at(body, where, text)
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
@pytest.mark.parametrize("dialect", WIRE, ids=IDS)
def test_mutated_bodies_never_5xx_and_keep_the_error_shape(served, dialect: WireDialect) -> None:
    @fuzz(250)
    @given(data=st.data(), stream=st.booleans())
    def run(data: st.DataObject, stream: bool) -> None:
        CASES["mutated", dialect.name] += 1
        raw = json.dumps(data.draw(mutated(SEEDS[dialect.name], stream))).encode()
        check_answer(dialect, served.call(dialect, raw, stream=stream), raw)

    run()
    still_serves(served, dialect)


@pytest.mark.parametrize("dialect", WIRE, ids=IDS)
def test_adversarial_bytes_never_5xx_and_keep_the_error_shape(served, dialect: WireDialect) -> None:
    plain = SEEDS[dialect.name]
    seeds = plain + [{**b, "stream": True} for b in plain if "contents" not in b]

    @fuzz(200)
    @given(raw=adversarial(seeds), stream=st.booleans())
    def run(raw: bytes, stream: bool) -> None:
        CASES["adversarial", dialect.name] += 1
        check_answer(dialect, served.call(dialect, raw, stream=stream), raw)
        still_serves(served, dialect)

    run()


@pytest.mark.parametrize("dialect", WIRE, ids=IDS)
def test_huge_strings_are_served_or_refused_cleanly(served, dialect: WireDialect) -> None:
    @fuzz(3)
    @given(raw=huge_string(SEEDS[dialect.name]))
    def run(raw: bytes) -> None:
        CASES["huge_string", dialect.name] += 1
        assert len(raw) >= 1 << 20
        check_answer(dialect, served.call(dialect, raw), raw)

    run()
    still_serves(served, dialect)


def test_deep_nesting_up_to_the_limit_is_served_and_past_it_refused(served) -> None:
    """Nesting up to the proxy's limit goes through every dialect; one level more is a 400
    in shape (tests/test_fuzz_limits.py fuzzes the same rule everywhere in a body)."""
    for dialect in WIRE:
        for depth in (100, 400, MAX_DEPTH - 1, MAX_DEPTH, 900):  # the body adds a level
            raw = json.dumps({**dialect.good, "x": PLACE}).encode().replace(
                PLACE_BYTES, nested(depth, "list"))
            CASES["deep_nesting", dialect.name] += 1
            resp = served.call(dialect, raw)
            check_answer(dialect, resp, raw)
            assert resp.status_code == (200 if depth < MAX_DEPTH else 400), resp.text[:300]


# ------------------------------------------------------------------ bugs this fuzzing found
# Each answered 500 until fixed; kept as regressions.
def _with(dialect: str, raw_value: bytes, **fields: Any) -> tuple[WireDialect, bytes]:
    d = BY_NAME[dialect]
    body = {**d.good, **fields}
    return d, json.dumps(body).encode().replace(PLACE_BYTES, raw_value)


_USER = {"role": "user", "content": "hi"}
BUGS = {
    # msgspec raises RecursionError (not DecodeError) past ~1000 levels, in every dialect.
    **{f"deep_nesting_{d.name}": (d.name, nested(10_000, "list"), {"x": PLACE})
       for d in WIRE},
    "chat_role_list": ("openai_chat", b"[]", {"messages": [{"role": PLACE, "content": "x"}]}),
    "responses_item_type_list": ("openai_responses", b"[]",
                                 {"input": [{"type": PLACE, "role": "user", "content": "x"}]}),
    "responses_role_list": ("openai_responses", b"[]",
                            {"input": [{"type": "message", "role": PLACE, "content": "x"}]}),
    "anthropic_role_list": ("anthropic", b"[]", {"messages": [{"role": PLACE, "content": "x"}]}),
    "anthropic_block_type_object": ("anthropic", b"{}", {"messages": [
        {"role": "user", "content": [{"type": PLACE, "text": "x"}]}]}),
    "anthropic_tool_choice_type_list": ("anthropic", b"[]", {"tool_choice": {"type": PLACE}}),
    "anthropic_effort_list": ("anthropic", b"[]", {"output_config": {"effort": PLACE}}),
    "gemini_empty_parts": ("gemini", b"[]", {"contents": [{"role": "user", "parts": PLACE}],
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
_frames = st.one_of(
    st.builds(lambda t, i: sse_frame(chat_chunk(t, i)), st.text(max_size=8), st.integers(0, 1000)),
    st.builds(lambda b, n: sse_frame(b)[:n], st.just(chat_chunk("cut", 5)), st.integers(6, 60)),
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


@pytest.mark.parametrize("dialect", WIRE, ids=IDS)
def test_broken_engine_stream_is_a_clean_error_and_a_failed_turn(broken, dialect: WireDialect
                                                                 ) -> None:
    fake, served = broken

    @fuzz(60)
    @given(head=st.booleans(), frames=st.lists(_frames, max_size=6))
    def run(head: bool, frames: list[bytes]) -> None:
        CASES["broken_engine_sse", dialect.name] += 1
        script = ([sse_frame(FIRST_CHUNK)] if head else []) + frames  # no finish_reason, ever
        fake.script = script
        before = len(served.store.turns(served.key))
        resp = served.call(dialect, dialect.good_bytes(stream=True), stream=True)
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
            assert dialect.shape(resp.status_code, body) and not internal_error(body), body
        fake.ok = True
        try:
            good = served.call(dialect, dialect.good_bytes(stream=True), stream=True)
            assert good.status_code == 200 and dialect.stream_error not in good.content
            assert served.store.turns(served.key)[-1].status == "ok"
        finally:
            fake.ok = False

    run()
