"""Engine faults in every dialect (issue 8, item 2), with the official SDKs as clients.

The engine is `FakeVLLM` behind the real `VLLMEngine`. Killed mid-stream: the client gets
its dialect's error event after the tokens already sent, its SDK raises, the turn is stored
as failed with the tokens sampled so far, and it never becomes a trainable sample. Not
streamed: an engine 500 or garbage is a 502, an engine slower than the read timeout a 504,
each in the dialect's error shape, and the proxy serves the next request.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harnessrl.proxy.engines.vllm import VLLMEngine
from harnessrl.proxy.serve import in_thread
from harnessrl.rollout.analysis.chains import link
from tests.conftest import ServedProxy, make_proxy
from tests.dialects import IDS, WIRE, WireDialect
from tests.fake_vllm import PROMPT_IDS, TOKENS, FakeVLLM

READ_TIMEOUT = 0.5
SLOW = 1.5  # how long the `slow` engine takes: past the read timeout
SENT_BEFORE_CUT = [t[1] for t in TOKENS[:2]]  # `cut` dies after two tokens: "Hel", "lo"


@pytest.fixture
def fake() -> Iterator[FakeVLLM]:
    # Past the read timeout by a second, not five: the server's shutdown waits for it.
    fake = FakeVLLM(slow=SLOW)
    with in_thread(fake.app()) as (url, server):
        fake.url, fake.server = url, server  # type: ignore[attr-defined]
        yield fake


@pytest.fixture
def served(fake, tmp_path: Path) -> Iterator[ServedProxy]:
    engine = VLLMEngine(fake.url, read_timeout=READ_TIMEOUT)  # type: ignore[attr-defined]
    with ServedProxy(make_proxy(engine, tmp_path / "run")).running() as served:
        rollout = served.new_rollout()
        served.key, served.root = rollout["key"], rollout["base_url"]  # type: ignore[attr-defined]
        yield served


def still_serves(served, dialect: WireDialect) -> None:
    resp = dialect.post(served)
    assert resp.status_code == 200, resp.text
    assert "Hello!" in resp.text
    assert served.store.turns(served.key)[-1].status == "ok"


# ------------------------------------------------------------------ killed mid-stream
@pytest.mark.parametrize("dialect", WIRE, ids=IDS)
def test_engine_killed_mid_stream(served, fake, dialect: WireDialect) -> None:
    fake.mode = "cut"
    # On the wire: the tokens already sampled, then the dialect's error event, last.
    resp = dialect.post(served, stream=True)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith(
        "text/event-stream")
    content = resp.content
    error_at = content.rfind(dialect.last_event)
    assert error_at > 0, content
    assert 0 <= content.find(b'"Hel"') < content.find(b'"lo"') < error_at, content
    last = content.rstrip().rsplit(b"\n\n", 1)[-1]
    assert last.startswith(dialect.last_event), content
    assert b"broke off" in last and b"internal proxy error" not in content

    # The dialect's own SDK raises: no hang, no silent success.
    with pytest.raises(dialect.sdk_error) as caught:
        dialect.sdk(served, True)
    assert "broke off" in str(caught.value)

    turns = served.store.turns(served.key)
    assert len(turns) == 2
    for turn in turns:
        assert turn.status == "failed" and turn.dialect == dialect.name
        assert "broke off" in turn.error and turn.error.startswith(f"{turn.error_kind}: ")
        assert list(turn.completion.tokens.prompt_ids) == PROMPT_IDS
        assert list(turn.completion.tokens.completion_ids) == SENT_BEFORE_CUT
        assert dialect.last_event in turn.raw_response  # what the client was sent
    # A failed turn never becomes a trainable sample.
    linked = link(turns)
    assert linked.chains == []
    assert [(e.turn, e.reason) for e in linked.excluded] == [(t.index, "failed") for t in turns]

    fake.mode = "ok"
    still_serves(served, dialect)
    assert len(link(served.store.turns(served.key)).chains) == 1


# ------------------------------------------------------------------ not streamed
@pytest.mark.parametrize(("mode", "status", "words"), [
    ("error500", 502, "engine core died"),
    ("garbage", 502, "not the expected JSON"),
    ("slow", 504, "in time"),
])
@pytest.mark.parametrize("dialect", WIRE, ids=IDS)
def test_engine_failure_not_streamed(served, fake, dialect: WireDialect, mode: str, status: int,
                                     words: str) -> None:
    fake.mode = mode
    resp = dialect.post(served)
    assert resp.status_code == status, resp.text
    error = dialect.error(resp.status_code, resp.json())
    assert words in error["message"]
    assert dialect.error_type(error) == dialect.types[status]

    with pytest.raises(dialect.sdk_error) as caught:
        dialect.sdk(served, False)
    code = getattr(caught.value, "status_code", None) or getattr(caught.value, "code", None)
    assert code == status, caught.value

    turns = served.store.turns(served.key)
    assert [t.status for t in turns] == ["failed", "failed"]
    assert all(words in t.error for t in turns)
    # The kind is a field (what the runner counts as an engine failure), not parsed.
    assert all(t.error_kind in ("engine_error", "timeout")
               and t.error.startswith(f"{t.error_kind}: ") for t in turns), turns
    assert link(turns).chains == []

    fake.mode = "ok"
    still_serves(served, dialect)


# ------------------------------------------------------------------ paced reads
@pytest.mark.parametrize("dialect", WIRE, ids=IDS)
def test_a_paced_stream_is_captured_exactly_and_cut_offs_still_fail(
        fake, tmp_path: Path, dialect: WireDialect) -> None:
    """`stream_interval` (serve --stream-interval-ms) changes how often the engine's stream
    is read, not what is captured: the same ids and logprobs, the reply whole, through the
    dialect's own SDK; an engine killed mid-stream is still the dialect's error event."""
    engine = VLLMEngine(fake.url, read_timeout=5, stream_interval=0.05)  # type: ignore[attr-defined]
    with ServedProxy(make_proxy(engine, tmp_path / "run")).running() as served:
        rollout = served.new_rollout()
        served.key, served.root = rollout["key"], rollout["base_url"]  # type: ignore[attr-defined]
        dialect.sdk(served, True)
        resp = dialect.post(served, stream=True)
        assert resp.status_code == 200 and b"Hel" in resp.content and b"lo" in resp.content
        fake.mode = "cut"
        cut = dialect.post(served, stream=True)
        assert cut.content.rstrip().rsplit(b"\n\n", 1)[-1].startswith(dialect.last_event)
        turns = served.store.turns(served.key)
    assert [t.status for t in turns] == ["ok", "ok", "failed"]
    for turn in turns[:2]:
        tokens = turn.completion.tokens
        assert list(tokens.prompt_ids) == PROMPT_IDS
        assert list(tokens.completion_ids) == [t[1] for t in TOKENS]
        assert list(tokens.logprobs) == [t[2] for t in TOKENS]
    assert list(turns[2].completion.tokens.completion_ids) == SENT_BEFORE_CUT
