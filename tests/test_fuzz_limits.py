"""Fuzzing at the limits (issue 13): nesting depth just under, at and far past the proxy's
limit, and integers outside every range (32-bit, 64-bit, a float's, thousands of digits),
planted anywhere in a request of every dialect, in the argument text of a resent tool call,
in engine replies, and on `/rollouts`.

Properties, whatever was sent: no 5xx of the proxy's own making, every error in the
caller's shape, every call recorded as exactly one turn, and the rule itself: a body (or
an argument text) nested past `MAX_DEPTH` is a 400 that says so, and one within it is not.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
from harnessrl.proxy.engines.vllm import VLLMEngine
from harnessrl.proxy.serve import in_thread
from harnessrl.proxy.wire.boundary import MAX_PAGE
from harnessrl.proxy.wire.nesting import MAX_DEPTH
from harnessrl.types import MAX_TOKEN_ID
from tests.conftest import make_proxy
from tests.dialects import BY_NAME, IDS, WIRE, WireDialect, openai_shape
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
    fuzz,
    internal_error,
    nested,
    paths,
    set_at,
    sse_frame,
)

CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
depths = st.one_of(st.integers(MAX_DEPTH - 3, MAX_DEPTH + 3), st.integers(1, 60),
                   st.integers(900, 1100), st.sampled_from([5_000, 100_000]))
_BIG = [2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63), -(2**63) - 1, 10**30]
big_literals = st.one_of(
    st.sampled_from([str(n).encode() for n in _BIG]),
    st.sampled_from([b"1" + b"0" * 400, b"-1" + b"0" * 400, b"9" * 5000, b"1e308", b"-1e308",
                     b"1e-400", b"1.5e300", b"4294967296.0"]),
    st.integers(min_value=-(2**80), max_value=2**80).map(lambda n: str(n).encode()))
# Integer fields the dialects map, by where they sit in a body.
_INT_FIELDS = {
    "openai_chat": [("max_tokens",), ("max_completion_tokens",), ("top_k",), ("seed",), ("n",),
                    ("temperature",), ("top_p",), ("presence_penalty",)],
    "openai_responses": [("max_output_tokens",), ("temperature",), ("top_p",)],
    "anthropic": [("max_tokens",), ("top_k",), ("temperature",), ("top_p",)],
    "gemini": [("generationConfig", "maxOutputTokens"), ("generationConfig", "topK"),
               ("generationConfig", "seed"), ("generationConfig", "temperature"),
               ("generationConfig", "candidateCount")],
}


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture(scope="module")
def served(tokenizer, loop: LoopThread, tmp_path_factory) -> Iterator[InProcess]:
    engine = ScriptedEngine(tokenizer, replay([CALL]), model="scripted")
    with InProcess(make_proxy(engine, tmp_path_factory.mktemp("limits")), loop) as served:
        yield served


def answer_and_record(served: InProcess, dialect: WireDialect, raw: bytes, *, stream: bool = False
                      ) -> httpx.Response:
    """Sends `raw`; checks the answer's properties and that it left exactly one turn."""
    before = len(served.store.turns(served.key))
    resp = served.call(dialect, raw, stream=stream)
    check_answer(dialect, resp, raw)
    assert len(served.store.turns(served.key)) == before + 1, (resp.status_code, raw[:200])
    return resp


def is_nesting_refusal(resp: httpx.Response) -> bool:
    return resp.status_code == 400 and "nested" in resp.text


def _planted(body: dict[str, Any], where: tuple[Any, ...], value: bytes) -> bytes:
    body = set_at(copy.deepcopy(body), where, PLACE)
    return json.dumps(body).encode().replace(PLACE_BYTES, value, 1)


# ------------------------------------------------------------------ nesting in the body
@pytest.mark.parametrize("dialect", WIRE, ids=IDS)
def test_nesting_anywhere_in_a_body_follows_the_limit(served, dialect: WireDialect) -> None:
    @fuzz(60)
    @given(data=st.data(), depth=depths, kind=st.sampled_from(["list", "dict"]),
           stream=st.booleans())
    def run(data: st.DataObject, depth: int, kind: str, stream: bool) -> None:
        seed = data.draw(st.sampled_from(SEEDS[dialect.name]))
        where = data.draw(st.sampled_from([p for p in paths(seed) if p]))
        raw = _planted(seed, where, nested(depth, kind))
        resp = answer_and_record(served, dialect, raw, stream=stream)
        # the planted value sits inside len(where) containers; seeds nest far less
        assert is_nesting_refusal(resp) == (len(where) + depth > MAX_DEPTH), (
            where, depth, resp.text[:300])

    run()


# ------------------------------------------------------------------ nesting in argument text
def _issued(served: InProcess) -> str:
    chat = BY_NAME["openai_chat"]
    resp = served.call(chat, json.dumps({**chat.good, "tools": chat.good["tools"]}).encode())
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["message"]["tool_calls"][0]["id"]


def _history(dialect: str, call_id: str, arguments: str) -> dict[str, Any]:
    if dialect == "openai_chat":
        return {**BY_NAME["openai_chat"].good, "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": call_id, "type": "function",
                "function": {"name": "bash", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": call_id, "content": "out"}]}
    return {**BY_NAME["openai_responses"].good, "input": [
        {"type": "message", "role": "user", "content": "go"},
        {"type": "function_call", "call_id": call_id, "name": "bash", "arguments": arguments},
        {"type": "function_call_output", "call_id": call_id, "output": "out"}]}


def _text(depth: int, kind: str) -> str:
    return nested(depth, kind).decode()


@pytest.mark.parametrize("dialect", ["openai_chat", "openai_responses"])
def test_nesting_in_resent_argument_text_follows_the_limit(served, dialect: str) -> None:
    target = BY_NAME[dialect]

    @fuzz(40)
    @given(depth=depths, kind=st.sampled_from(["list", "dict"]), issued=st.booleans(),
           cut=st.booleans(), stream=st.booleans())
    def run(depth: int, kind: str, issued: bool, cut: bool, stream: bool) -> None:
        call_id = _issued(served) if issued else "call_made_up"
        text = _text(depth, kind)
        text = text[:-1] if cut else text  # not JSON: read for its brackets all the same
        raw = json.dumps(_history(dialect, call_id, text)).encode()
        resp = answer_and_record(served, target, raw, stream=stream)
        assert is_nesting_refusal(resp) == (depth > MAX_DEPTH), (depth, cut, resp.text)

    run()


_CALL_IN_HISTORY = {
    "anthropic": lambda value: {**BY_NAME["anthropic"].good, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash",
                                           "input": value}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "out"}]}]},
    "gemini": lambda value: {**BY_NAME["gemini"].good, "contents": [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "bash", "args": value}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "bash",
                                                         "response": {"out": "x"}}}]}]},
}
# How many containers enclose the call's arguments object in those bodies.
_ARGS_AT = {"anthropic": 5, "gemini": 5}


@pytest.mark.parametrize("dialect", ["anthropic", "gemini"])
def test_nesting_in_resent_argument_objects_follows_the_limit(served, dialect: str) -> None:
    target = BY_NAME[dialect]

    @fuzz(30)
    @given(depth=depths, stream=st.booleans())
    def run(depth: int, stream: bool) -> None:
        # the arguments object holds the nesting under one key: depth + 1 levels of its own
        body = _CALL_IN_HISTORY[dialect](PLACE)
        raw = json.dumps(body).encode().replace(
            PLACE_BYTES, b'{"deep": ' + nested(depth, "list") + b"}", 1)
        resp = answer_and_record(served, target, raw, stream=stream)
        assert is_nesting_refusal(resp) == (_ARGS_AT[dialect] + depth + 1 > MAX_DEPTH), (
            depth, resp.text[:300])

    run()


# ------------------------------------------------------------------ integers out of range
@pytest.mark.parametrize("dialect", WIRE, ids=IDS)
def test_out_of_range_numbers_anywhere_are_served_or_refused_in_shape(served, dialect: WireDialect
                                                                      ) -> None:
    numeric = [(p, seed) for seed in SEEDS[dialect.name] for p in paths(seed)
               if p and isinstance(_value(seed, p), int | float)]

    @fuzz(80)
    @given(data=st.data(), literal=big_literals, stream=st.booleans())
    def run(data: st.DataObject, literal: bytes, stream: bool) -> None:
        choice = data.draw(st.sampled_from(["field", "field", "leaf", "any"]))
        if choice == "field" or not numeric:
            seed = copy.deepcopy(dialect.good)
            where = data.draw(st.sampled_from(_INT_FIELDS[dialect.name]))
            if len(where) == 2:
                seed.setdefault(where[0], {})
            seed = set_at(seed, where, 0)
        elif choice == "leaf":
            where, seed = data.draw(st.sampled_from(numeric))
        else:
            seed = data.draw(st.sampled_from(SEEDS[dialect.name]))
            where = data.draw(st.sampled_from([p for p in paths(seed) if p]))
        answer_and_record(served, dialect, _planted(seed, where, literal), stream=stream)

    run()


def _value(body: Any, where: tuple[Any, ...]) -> Any:
    for step in where:
        body = body[step]
    return body


def test_token_ids_out_of_range_from_the_engine_fail_the_call_and_are_recorded(
        loop, tmp_path_factory) -> None:
    fake = BrokenVLLM()
    with in_thread(fake.app()) as (url, _server):
        proxy = make_proxy(VLLMEngine(url, read_timeout=10), tmp_path_factory.mktemp("ids"))
        with InProcess(proxy, loop) as served:
            dialects = st.sampled_from(WIRE)
            ids = st.one_of(st.integers(0, 1000), st.integers(MAX_TOKEN_ID - 2, MAX_TOKEN_ID + 2),
                            st.integers(2**31, 2**70), st.integers(-(2**40), -1))

            @fuzz(60)
            @given(dialect=dialects, prompt=st.lists(ids, min_size=1, max_size=3),
                   sampled=st.lists(ids, min_size=1, max_size=3), stream=st.booleans())
            def run(dialect: WireDialect, prompt: list[int], sampled: list[int], stream: bool
                    ) -> None:
                fake.script = _reply(prompt, sampled, stream)
                before = len(served.store.turns(served.key))
                resp = served.call(dialect, dialect.good_bytes(stream=stream), stream=stream)
                turns = served.store.turns(served.key)
                assert len(turns) == before + 1
                fits = all(0 <= i <= MAX_TOKEN_ID for i in prompt + sampled)
                assert (turns[-1].status == "ok") == fits, (prompt, sampled, turns[-1].error)
                assert resp.status_code in ((200,) if fits else (200, 502)), resp.text
                if resp.status_code != 200:
                    assert dialect.shape(502, resp.json()) and not internal_error(resp.json())
                if not fits:
                    assert turns[-1].error.startswith("engine_error: "), turns[-1].error

            run()


def _reply(prompt: list[int], sampled: list[int], stream: bool) -> list[bytes]:
    if stream:
        head = {**FIRST_CHUNK, "prompt_token_ids": prompt}
        chunks = [chat_chunk("x", i) for i in sampled]
        chunks[-1]["choices"][0]["finish_reason"] = "stop"
        return [sse_frame(head), *(sse_frame(c) for c in chunks), b"data: [DONE]\n\n"]
    logprobs = {"content": [{"token": "x", "logprob": -0.5} for _ in sampled]}
    return [json.dumps({"model": "fake", "prompt_token_ids": prompt, "choices": [{
        "finish_reason": "stop", "message": {"role": "assistant", "content": "x" * len(sampled)},
        "token_ids": sampled, "logprobs": logprobs}]}).encode()]


# ------------------------------------------------------------------ /rollouts
_SAMPLING_FIELDS = ["temperature", "top_p", "top_k", "min_p", "max_tokens", "seed",
                    "presence_penalty", "frequency_penalty", "repetition_penalty"]


@st.composite
def rollout_bodies(draw: st.DrawFn) -> bytes:
    parts = []
    if draw(st.booleans()):
        name = draw(st.sampled_from(_SAMPLING_FIELDS))
        parts.append(b'"sampling": {"' + name.encode() + b'": ' + draw(big_literals) + b"}")
    if draw(st.booleans()):
        inner = draw(st.one_of(big_literals, st.builds(nested, depths,
                                                       st.sampled_from(["list", "dict"]))))
        parts.append(b'"metadata": {"x": ' + inner + b"}")
    if draw(st.booleans()):
        parts.append(b'"unset_sampling": ' + draw(st.sampled_from(
            [b"[]", b'["top_p"]', b'["nope"]', b"[1]", nested(3000, "list")])))
    return b"{" + b", ".join(parts) + b"}"


queries = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["0", "1", str(MAX_PAGE), str(MAX_PAGE + 1), str(2**63 - 1), str(2**63),
                     "9" * 5000, "", "x", "1.5", "1e3", " 7", "-0", "0x10", "\u0663"]))


def test_rollouts_endpoints_never_5xx_at_the_limits(served) -> None:
    @fuzz(150)
    @given(raw=rollout_bodies(), offset=st.none() | queries, limit=st.none() | queries)
    def run(raw: bytes, offset: str | None, limit: str | None) -> None:
        resp = served.post("/rollouts", raw)
        _check_admin(resp, raw)
        if resp.status_code != 201:
            assert resp.status_code == 400, resp.text
            return
        key = resp.json()["key"]
        params = {k: v for k, v in {"offset": offset, "limit": limit}.items() if v is not None}
        got = served.loop.run(served.client.get(f"/rollouts/{key}", params=params,
                                                headers={"Authorization": f"Bearer {key}"}))
        _check_admin(got, params)
        assert (got.status_code == 200) == (_in(offset, 2**63 - 1) and _in(limit, MAX_PAGE)), (
            params, got.text[:300])

    run()


def _check_admin(resp: httpx.Response, sent: Any) -> None:
    assert resp.status_code < 500, (resp.status_code, resp.text[:300], str(sent)[:300])
    if resp.status_code >= 400:
        body = resp.json()
        assert openai_shape(resp.status_code, body) and not internal_error(body), body


def _in(value: str | None, high: int) -> bool:
    if value is None:
        return True
    try:
        return 0 <= int(value) <= high
    except ValueError:
        return False
