"""Bad input and engine faults: each gets an OpenAI-shaped error with the right status, is
recorded, and the proxy keeps serving."""

from __future__ import annotations

import itertools
from pathlib import Path

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.proxy.engines.vllm import VLLMEngine
from harnessrl.proxy.serve import in_thread
from tests.conftest import ServedProxy, make_proxy
from tests.fake_vllm import PROMPT_IDS, TOKENS, FakeVLLM

GOOD = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def fake():
    fake = FakeVLLM()
    with in_thread(fake.app()) as (url, server):
        fake.url, fake.server = url, server
        yield fake


@pytest.fixture
def served(fake, tmp_path: Path):
    engine = VLLMEngine(fake.url, read_timeout=2.0)
    proxy = make_proxy(engine, tmp_path / "run", max_body_bytes=64 * 1024, strict_model=True)
    with ServedProxy(proxy).running() as served:
        rollout = served.new_rollout()
        served.key = rollout["key"]
        served.chat_url = f"{rollout['base_urls']['openai']}/chat/completions"
        yield served


def assert_error(resp: httpx.Response, status: int, kind: str, *words: str) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == kind
    for word in words:
        assert word in error["message"]
    return error


def still_serves(served) -> None:
    resp = httpx.post(served.chat_url, json=GOOD)
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == "Hello!"


BAD_BODIES = [
    (b'{"model": "m", "messages": [', "not valid JSON", None),
    (b"", "empty", None),
    (b'["a list"]', "must be an object", "body"),
    (b'{"model": "m"}', "`messages` must be an array", "messages"),
    (b'{"model": "m", "messages": []}', "at least one", "messages"),
    (b'{"model": "m", "messages": "hi"}', "got a string", "messages"),
    (b'{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}', "role",
     "messages[0].role"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
     "`temperature` must be a number", "temperature"),
    (b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', "content", None),
    (b'{"model": "m", "messages": [{"role": "tool", "content": "x"}]}', "tool_call_id",
     "messages[0].tool_call_id"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 3}', "`n` must be 1",
     "n"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": 7}',
     "tool_choice", "tool_choice"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}', "JSON", None),
]


@pytest.mark.parametrize(("body", "words", "param"), BAD_BODIES)
def test_bad_body_gets_400_and_is_recorded(served, body, words, param) -> None:
    resp = httpx.post(served.chat_url, content=body, headers={"content-type": "application/json"})
    error = assert_error(resp, 400, "invalid_request_error", words)
    if param is not None:
        assert error["param"] == param
    [turn] = served.store.turns(served.key)
    assert turn.status == "failed" and turn.raw_request == body
    assert turn.error.startswith("invalid_request: ") and turn.completion is None
    assert turn.error_kind == "invalid_request"
    still_serves(served)


def test_oversize_body_gets_413(served) -> None:
    body = {**GOOD, "messages": [{"role": "user", "content": "x" * 100_000}]}
    assert_error(httpx.post(served.chat_url, json=body), 413, "invalid_request_error", "65536")
    still_serves(served)


def test_unknown_model_with_strict_models_gets_404(served) -> None:
    error = assert_error(httpx.post(served.chat_url, json={**GOOD, "model": "gpt-9"}), 404,
                         "not_found_error", "gpt-9", "fake")
    assert error["code"] == "model_not_found"
    assert httpx.post(served.chat_url, json={**GOOD, "model": "fake"}).status_code == 200


def test_unknown_key_gets_401_in_openai_shape(served) -> None:
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="hrl-not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        client.chat.completions.create(**GOOD)
    assert caught.value.status_code == 401 and "POST /rollouts" in caught.value.message
    resp = httpx.post(f"{served.url}/r/hrl-nope/v1/chat/completions", json=GOOD)
    assert_error(resp, 401, "authentication_error", "unknown")


def test_engine_rejection_is_a_400_not_a_retry_storm(served, fake) -> None:
    fake.mode = "error400"
    assert_error(httpx.post(served.chat_url, json=GOOD), 400, "invalid_request_error",
                 "maximum context length")
    [turn] = served.store.turns(served.key)
    assert turn.status == "failed" and "maximum context length" in turn.error
    fake.mode = "ok"
    still_serves(served)


@pytest.mark.parametrize(("mode", "status", "words"), [
    ("error500", 502, "engine core died"),
    ("garbage", 502, "not the expected JSON"),
    ("slow", 504, "in time"),
])
def test_engine_failures(served, fake, mode, status, words) -> None:
    fake.mode = mode
    resp = httpx.post(served.chat_url, json=GOOD, timeout=30)
    assert resp.status_code == status, resp.text
    assert words in resp.json()["error"]["message"]
    assert served.store.turns(served.key)[0].status == "failed"
    fake.mode = "ok"
    still_serves(served)


def test_engine_down_gets_503(served, fake) -> None:
    fake.server.should_exit = True
    import time

    time.sleep(0.5)
    assert_error(httpx.post(served.chat_url, json=GOOD), 503, "service_unavailable",
                 "unreachable")


def test_engine_killed_mid_stream_gives_error_event_and_failed_turn(served, fake) -> None:
    fake.mode = "cut"
    client = openai.OpenAI(base_url=served.chat_url.rsplit("/chat", 1)[0], api_key="x",
                           max_retries=0)
    with pytest.raises(openai.APIError) as caught:
        list(client.chat.completions.create(**GOOD, stream=True))
    assert "broke off" in str(caught.value.message)
    [turn] = served.store.turns(served.key)
    assert turn.status == "failed"
    assert list(turn.completion.tokens.completion_ids) == [t[1] for t in TOKENS[:2]]
    fake.mode = "ok"
    still_serves(served)


def test_vllm_stream_is_captured_exactly(served, fake) -> None:
    client = openai.OpenAI(base_url=served.chat_url.rsplit("/chat", 1)[0], api_key="x",
                           max_retries=0)
    chunks = list(client.chat.completions.create(**GOOD, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello!"
    [turn] = served.store.turns(served.key)
    tokens = turn.completion.tokens
    assert list(tokens.prompt_ids) == PROMPT_IDS
    assert list(tokens.completion_ids) == [t[1] for t in TOKENS]
    assert list(tokens.logprobs) == [t[2] for t in TOKENS]
    assert turn.flags == ()
    sent = fake.requests[-1]
    assert sent["return_token_ids"] is True and sent["logprobs"] is True and sent["stream"]
    assert sent["model"] == "fake"


def test_merge_chunks_keeps_every_id_and_logprob_in_order() -> None:
    from harnessrl.proxy.engines.vllm import merge_chunks
    from harnessrl.types import Chunk, Finished, TextDelta

    events = [Chunk((TextDelta("a"),), (1,), (-0.1,)), Chunk((TextDelta("b"),), (2, 3),
                                                              (-0.2, -0.3)),
              Chunk((TextDelta("c"),), None, None), Finished("stop")]
    merged = merge_chunks(events)
    assert merged == [Chunk((TextDelta("a"), TextDelta("b")), (1, 2, 3), (-0.1, -0.2, -0.3)),
                      Chunk((TextDelta("c"),), None, None), Finished("stop")]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.text(max_size=3), st.booleans(), st.integers(0, 3)),
    st.just(None)), max_size=40))
def test_merge_chunks_joins_every_mergeable_run_and_loses_nothing(spec) -> None:
    """Any mix of chunks with and without ids, and other events between them: the same
    deltas, ids and logprobs in the same order, and no two adjacent chunks left that could
    have been one."""
    from harnessrl.proxy.engines.vllm import merge_chunks
    from harnessrl.types import Chunk, Finished, TextDelta

    events: list = []
    for n, item in enumerate(spec):
        if item is None:
            events.append(Finished("stop"))
            continue
        text, with_ids, count = item
        ids = tuple(range(n * 10, n * 10 + count)) if with_ids else None
        events.append(Chunk((TextDelta(text),), ids, None if ids is None else
                            tuple(-0.5 * i for i in ids)))
    merged = merge_chunks(events)

    def flat(evs: list, field: str) -> list:
        return [x for e in evs if isinstance(e, Chunk) for x in getattr(e, field) or ()]

    for field in ("deltas", "token_ids", "logprobs"):
        assert flat(merged, field) == flat(events, field)
    assert [e for e in merged if not isinstance(e, Chunk)] == \
        [e for e in events if not isinstance(e, Chunk)]
    for a, b in itertools.pairwise(merged):
        assert not (isinstance(a, Chunk) and isinstance(b, Chunk)
                    and (a.token_ids is None) == (b.token_ids is None))
