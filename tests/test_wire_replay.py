"""Every real request a harness sent (tests/recorded) is accepted by the proxy,
recorded, and answered in its own dialect."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
from harnessrl.proxy.wire.sse import SSEDecoder
from tests.helpers import ServedProxy, make_proxy, recorded_requests

WIRE = recorded_requests()
DIALECT_BY_PATH = {"/v1/chat/completions": "openai_chat", "/v1/messages": "anthropic",
                   "/v1/responses": "openai_responses"}


@pytest.fixture(scope="module")
def served(tokenizer, tmp_path_factory):
    engine = ScriptedEngine(tokenizer, replay(["DONE"]), model="scripted")
    with ServedProxy(make_proxy(engine, tmp_path_factory.mktemp("wire"))).running() as served:
        yield served


@pytest.mark.parametrize("path", WIRE, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_recorded_request_is_accepted(served, path: Path) -> None:
    wire = json.loads(path.read_text())
    key = served.new_rollout()["key"]
    query = {k: v[0] for k, v in (wire.get("query") or {}).items()}
    resp = httpx.post(f"{served.url}/r/{key}{wire['path']}", params=query, json=wire["body"],
                      timeout=60)
    assert resp.status_code == 200, resp.text
    if resp.headers["content-type"].startswith("text/event-stream"):
        decoder = SSEDecoder()
        events = decoder.feed(resp.content) + decoder.finish()
        assert events and not any('"error"' in e.data[:12] for e in events)
    [turn] = served.store.turns(key)
    assert turn.status == "ok" and turn.flags == ()
    assert turn.dialect == DIALECT_BY_PATH.get(wire["path"], "gemini")
    assert turn.raw_request == resp.request.content
    assert "DONE" in "".join(p.text for p in turn.completion.parts if hasattr(p, "text"))
