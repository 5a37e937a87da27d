"""Issue 32: every response framing HTTP/1.1 allows an engine, against the proxy, in every
dialect, streamed and not, and through the official openai and google-genai SDKs; answers
that are really broken fail in the dialect's shape with the reason, and are stored failed.

The engine is tests/raw_engine.py's scripted stand-in for vLLM, written on a raw socket so
each framing is exactly what the test says (no HTTP library of ours or anyone's decides)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from harnessrl.proxy.engines.vllm import VLLMEngine
from tests.dialects import IDS, WIRE, WireDialect
from tests.helpers import ServedProxy, make_proxy
from tests.raw_engine import BROKEN, FRAMINGS, PROMPT_IDS, RawEngine

SDKS = [d for d in WIRE if d.name in ("openai_chat", "gemini")]


@contextlib.contextmanager
def proxy_before(engine: RawEngine, run_dir: Path) -> Iterator[ServedProxy]:
    with engine.running():
        proxy = make_proxy(VLLMEngine(engine.url, read_timeout=10), run_dir)
        with ServedProxy(proxy).running() as served:
            rollout = served.new_rollout()
            served.key, served.root = rollout["key"], rollout["base_url"]  # type: ignore[attr-defined]
            yield served


@pytest.fixture(scope="module", params=list(FRAMINGS))
def framed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[ServedProxy, RawEngine]]:
    engine = RawEngine(framing=request.param, tokens=6)
    with proxy_before(engine, tmp_path_factory.mktemp("run")) as served:
        yield served, engine


def last_turn_is_exact(served: ServedProxy, engine: RawEngine, dialect: WireDialect) -> None:
    turn = served.store.turns(served.key)[-1]  # type: ignore[attr-defined]
    assert turn.status == "ok" and turn.dialect == dialect.name, turn.error
    assert turn.completion is not None
    tokens = turn.completion.tokens
    assert list(tokens.prompt_ids or ()) == PROMPT_IDS
    assert list(tokens.completion_ids or ()) == engine.ids
    assert list(tokens.logprobs or ()) == engine.logprobs


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("dialect", WIRE, ids=IDS)
def test_every_framing_in_every_dialect(framed, dialect: WireDialect, stream: bool) -> None:
    served, engine = framed
    resp = dialect.post(served, stream=stream)
    assert resp.status_code == 200, resp.text
    if stream:
        assert dialect.stream_error not in resp.content, resp.content[-400:]
    for i in range(engine.tokens):
        assert f"w{i}".encode() in resp.content
    last_turn_is_exact(served, engine, dialect)


@pytest.mark.parametrize("dialect", SDKS, ids=[d.name for d in SDKS])
def test_every_framing_through_the_official_sdk_streaming(framed, dialect: WireDialect
                                                          ) -> None:
    served, engine = framed
    chunks = dialect.sdk(served, True)
    if dialect.name == "gemini":
        text = "".join(c.text or "" for c in chunks)
    else:
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == engine.text
    last_turn_is_exact(served, engine, dialect)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(("name", "words"), [(n, w) for n, (_, w) in BROKEN.items()],
                         ids=list(BROKEN))
def test_a_broken_engine_answer_fails_with_its_reason(tmp_path: Path, name: str, words: str,
                                                      stream: bool) -> None:
    """Each broken answer, in each dialect: an error in the dialect's shape (a status
    before a stream begins, its error event after), the turn stored failed, naming why."""
    with proxy_before(RawEngine(framing=name), tmp_path / "run") as served:
        for dialect in WIRE:
            resp = dialect.post(served, stream=stream)
            if resp.status_code == 200:
                assert stream, resp.text
                last = resp.content.rstrip().rsplit(b"\n\n", 1)[-1]
                assert last.startswith(dialect.last_event), resp.content[-300:]
            else:
                assert resp.status_code in (502, 503), resp.text
                assert words in dialect.error(resp.status_code, resp.json())["message"]
            turn = served.store.turns(served.key)[-1]  # type: ignore[attr-defined]
            assert turn.status == "failed" and words in (turn.error or ""), turn.error
