"""Retries recorded: the official SDKs' retry count (`x-stainless-retry-count`) is stored
on each turn, the retry names the attempt it repeated, and the attempt the client
retried is left out of training (`retried`) unless the config keeps it."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from pathlib import Path

import anthropic
import httpx
import msgspec
import openai
import pytest

from harnessrl.errors import EngineUnavailable
from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
from harnessrl.rollout.analysis.chains import EXCLUDE_REASONS, link, rollout_stats
from harnessrl.train.async_grpo.groups import rows_of
from harnessrl.train.config import TrainSettings
from harnessrl.types import ChatRequest, EngineEvent, ExcludedTurn
from harnessrl.ui import views
from tests.helpers import ServedProxy, make_proxy, make_turn

REPLY = "Second time lucky."


class FailsFirst(ScriptedEngine):
    """The scripted engine, but the first `failures` calls find it unavailable (503)."""

    failures = 1

    async def complete(self, request: ChatRequest, rollout: str | None = None
                       ) -> list[EngineEvent]:
        self._maybe_fail()
        return await super().complete(request, rollout)

    def stream(self, request: ChatRequest, rollout: str | None = None
               ) -> AsyncGenerator[EngineEvent, None]:
        async def events() -> AsyncGenerator[EngineEvent, None]:
            self._maybe_fail()
            async for event in super(FailsFirst, self).stream(request, rollout):
                yield event
        return events()

    def _maybe_fail(self) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise EngineUnavailable("the scripted engine is down for this one call")


@pytest.fixture
def engine(tokenizer) -> FailsFirst:
    return FailsFirst(tokenizer, replay([REPLY]), model="scripted")


@pytest.fixture
def served(engine: FailsFirst, tmp_path: Path):
    with ServedProxy(make_proxy(engine, tmp_path / "run")).running() as served:
        yield served


def _openai(served, key: str, stream: bool) -> str:
    client = openai.OpenAI(base_url=f"{served.url}/r/{key}/v1", api_key=key, max_retries=2,
                           timeout=30)
    reply = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=stream)
    if stream:
        return "".join(c.choices[0].delta.content or "" for c in reply if c.choices)
    return reply.choices[0].message.content or ""


def _anthropic(served, key: str, stream: bool) -> str:
    client = anthropic.Anthropic(base_url=f"{served.url}/r/{key}", api_key=key,
                                 max_retries=2, timeout=30)
    messages = [{"role": "user", "content": "hi"}]
    if stream:
        with client.messages.stream(model="m", max_tokens=64, messages=messages) as s:
            return "".join(s.text_stream)
    message = client.messages.create(model="m", max_tokens=64, messages=messages)
    return "".join(b.text for b in message.content if b.type == "text")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("sdk", [_openai, _anthropic], ids=["openai", "anthropic"])
def test_a_call_the_sdk_retried(served, sdk, stream: bool) -> None:
    key = served.new_rollout()["key"]
    assert sdk(served, key, stream) == REPLY
    failed, ok = served.store.turns(key)
    # The failed attempt and the retry that replaced it, told apart.
    assert (failed.status, failed.error_kind, failed.retry_count, failed.retry_of) == (
        "failed", "engine_unavailable", 0, None)
    assert (ok.status, ok.retry_count, ok.retry_of) == ("ok", 1, 0)
    assert ok.raw_request == failed.raw_request  # the SDK sent the same body again
    linked = link([failed, ok])
    assert linked.excluded == [ExcludedTurn(
        0, "retried", "retried as turn 1; it failed: engine_unavailable: the scripted engine "
        "is down for this one call")]
    assert [[t.index for t in c.turns] for c in linked.chains] == [[1]]
    # The config may judge it as any other turn: failed, then.
    assert [e.reason for e in link([failed, ok], keep_retried=True).excluded] == ["failed"]
    assert rollout_stats([failed, ok]).excluded == {"retried": 1}


def test_a_client_without_retries_records_no_count(served, engine: FailsFirst) -> None:
    key = served.new_rollout()["key"]
    engine.failures = 0
    resp = httpx.post(f"{served.url}/r/{key}/v1/chat/completions", timeout=30,
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 200
    [turn] = served.store.turns(key)
    assert turn.retry_count is None and turn.retry_of is None


@pytest.mark.parametrize(("header", "count", "of"), [
    (None, None, None),  # the same body again with no count: the harness's own repeat
    ("0", 0, None),  # a count of 0: a first attempt
    ("1", 1, 0), ("7", 7, 0),
    ("x", None, None), ("-1", None, None), ("99999999999", None, None),  # not counts
])
def test_only_the_clients_count_makes_a_repeat_a_retry(served, engine: FailsFirst,
                                                       header: str | None, count: int | None,
                                                       of: int | None) -> None:
    key = served.new_rollout()["key"]
    engine.failures = 0
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    url = f"{served.url}/r/{key}/v1/chat/completions"
    assert httpx.post(url, json=body, timeout=30).status_code == 200
    headers = {} if header is None else {"x-stainless-retry-count": header}
    assert httpx.post(url, json=body, headers=headers, timeout=30).status_code == 200
    _, again = served.store.turns(key)
    assert (again.retry_count, again.retry_of) == (count, of)


def test_a_retry_of_another_body_names_no_turn(served, engine: FailsFirst) -> None:
    key = served.new_rollout()["key"]
    engine.failures = 0
    url = f"{served.url}/r/{key}/v1/chat/completions"
    for text in ("one", "two"):
        httpx.post(url, json={"model": "m", "messages": [{"role": "user", "content": text}]},
                   headers={"x-stainless-retry-count": "1"}, timeout=30).raise_for_status()
    assert [t.retry_of for t in served.store.turns(key)] == [None, None]


def test_a_coded_retry_names_the_coded_attempt(served, engine: FailsFirst) -> None:
    """The same body, coded differently each time, is the same request."""
    import gzip

    import zstandard

    key = served.new_rollout()["key"]
    engine.failures = 1
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    url = f"{served.url}/r/{key}/v1/chat/completions"
    first = httpx.post(url, content=gzip.compress(body), timeout=30, headers={
        "content-encoding": "gzip", "x-stainless-retry-count": "0"})
    second = httpx.post(url, content=zstandard.ZstdCompressor().compress(body), timeout=30,
                        headers={"content-encoding": "zstd", "x-stainless-retry-count": "1"})
    assert (first.status_code, second.status_code) == (503, 200)
    assert [(t.content_encoding, t.retry_of) for t in served.store.turns(key)] == [
        ("gzip", None), ("zstd", 0)]


# ------------------------------------------------------------------ training and the viewer
def _retried_ok_pair() -> list:
    """Two ok turns of one call: the client gave up on the first (a read timeout, say)
    after the proxy had answered, and retried."""
    first = msgspec.structs.replace(make_turn("k", 0), retry_count=0)
    second = msgspec.structs.replace(make_turn("k", 1), retry_count=1, retry_of=0)
    return [first, second]


def test_an_ok_reply_the_client_retried_is_not_trained_unless_configured() -> None:
    turns = _retried_ok_pair()
    linked = link(turns)
    assert linked.excluded == [ExcludedTurn(0, "retried", "retried as turn 1")]
    assert [[t.index for t in c.turns] for c in linked.chains] == [[1]]
    assert {r.turns for r in rows_of(turns)} == {(1,)}
    kept = {r.turns for r in rows_of(turns, keep_retried=True)}
    assert kept == {(0,), (1,)}  # both trained, as two chains (1 does not extend 0)
    assert "retry" in EXCLUDE_REASONS["retried"]
    assert TrainSettings().grpo.train_retried is False
    assert msgspec.convert({"grpo": {"train_retried": True}}, TrainSettings).grpo.train_retried


def test_the_viewer_shows_the_retry_count_and_the_coding() -> None:
    import zstandard

    first, second = _retried_ok_pair()
    coded = msgspec.structs.replace(
        second, raw_request=zstandard.ZstdCompressor().compress(b'{"messages": []}'),
        content_encoding="zstd")
    shown = views.summary(coded, first)
    assert (shown["retry_count"], shown["retry_of"], shown["content_encoding"]) == (1, 0, "zstd")
    assert shown["native"]["key"] == "messages"  # the decoded body's list
    raw = views.detail(coded)["raw_request"]
    assert raw["coding"] == "zstd" and raw["kind"] == "json"
    assert raw["bytes"] == len(coded.raw_request) and '"messages": []' in raw["text"]
    bomb = msgspec.structs.replace(coded, raw_request=b"\x28\xb5\x2f\xfd broken")
    assert views.detail(bomb)["raw_request"]["text"].startswith("not decoded:")


def test_the_store_keeps_the_retry_fields(tmp_path: Path) -> None:
    import asyncio

    from harnessrl.store.writer import TraceStore
    from harnessrl.types import Rollout

    turns = _retried_ok_pair()
    turns[1] = msgspec.structs.replace(turns[1], content_encoding="br", raw_request=b"\x0b")

    async def write() -> None:
        with TraceStore(tmp_path) as store:
            await store.put_rollout(Rollout(key="k", created=1.0))
            for turn in turns:
                await store.add_turn(turn)

    asyncio.run(write())
    from harnessrl.store.reader import TraceReader

    with TraceReader(tmp_path) as reader:
        assert reader.turns("k") == turns
        assert reader.turns("k", bodies=False)[1].retry_of == 0
