"""The viewer shows why a chain broke: the drift cause of each break with the decoded text
on both sides of the first difference (headless Chromium, as tests/test_ui.py), and the
run's drift atlas. The run is a scripted rollout through the proxy, started from a real
hermes-agent request, whose third request truncates an earlier tool result."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
from harnessrl.ui.app import build_app
from tests.helpers import RECORDED, ServedProxy, make_proxy, unredacted

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("HARNESSRL_ARTIFACTS", ROOT / "tests" / "artifacts"))
RESULT = "".join(f"file{k}.txt  {k * 17} bytes\n" for k in range(40))
TRUNCATED = RESULT[:120] + "\n[... truncated]"


def _call(command: str) -> str:
    call = {"name": "terminal", "arguments": {"command": command}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


@pytest.fixture(scope="module")
def run_root(tokenizer, tiny_model, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ui-drift")
    engine = ScriptedEngine(tokenizer, replay([_call("ls"), _call("ls dir"), "done"]),
                            model=str(tiny_model))
    with ServedProxy(make_proxy(engine, root / "run")).running() as served:
        key = served.new_rollout(metadata={"harness": "hermes-agent"})["key"]
        body = unredacted(json.loads((RECORDED / "hermes-agent/request-1.json").read_text())
                          ["body"])
        body = {**body, "stream": False}
        body.pop("stream_options", None)
        history = list(body["messages"])
        for _ in range(2):
            resp = httpx.post(f"{served.url}/r/{key}/v1/chat/completions",
                              json={**body, "messages": history}, timeout=60)
            reply = {k: v for k, v in resp.json()["choices"][0]["message"].items()
                     if v is not None}
            history = [*history, reply, *({"role": "tool", "tool_call_id": c["id"],
                                           "content": RESULT} for c in reply["tool_calls"])]
        history[3]["content"] = TRUNCATED  # the harness shortened the first result
        httpx.post(f"{served.url}/r/{key}/v1/chat/completions",
                   json={**body, "messages": history}, timeout=60).raise_for_status()
    return root


def test_tokens_api_gives_each_break_its_cause(run_root: Path, tiny_model: Path) -> None:
    client = TestClient(build_app(run_root, str(tiny_model)))
    [rollout] = client.get("/api/rollouts", params={"run": "run"}).json()["rows"]
    view = client.get("/api/tokens", params={"run": "run", "key": rollout["key"],
                                             "index": 2}).json()
    first, broken = view["chains"]
    assert first["drift"] is None and first["turns"] == [0, 1]
    drift = broken["drift"]
    assert drift["cause"] == "tool_result_truncated" and drift["where"] == "inserted"
    assert "truncated" in drift["new_text"] and "file9.txt" in drift["old_text"]
    # the ids around the difference, decoded by the run's tokenizer
    assert "".join(drift["new_pieces"]) and drift["old_pieces"] != drift["new_pieces"]
    atlas = client.get("/api/atlas", params={"run": "run"}).json()["rows"]
    assert [(r["harness"], r["causes"]) for r in atlas] == [
        ("hermes-agent", {"tool_result_truncated": 1})]


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("Debian's chromium is not installed (scripts/bootstrap.sh installs it)")
    return path


@pytest.mark.slow
def test_the_viewer_shows_a_breaks_cause_and_the_decoded_difference(
        run_root: Path, tiny_model: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    from harnessrl.proxy.serve import in_thread

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with in_thread(build_app(run_root, str(tiny_model))) as (url, _server), \
            sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium())
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{url}/#/rollouts?run=run")
        page.get_by_role("link", name="drift atlas").click()
        row = page.locator("tr.atlas-row")
        expect(row).to_have_count(1)
        expect(row).to_contain_text("tool result truncated 1")
        expect(row).to_contain_text("main 3")
        page.locator(".example a").first.click()  # the example's tokens page
        drift = page.locator('.drift[data-cause="tool_result_truncated"]')
        expect(drift).to_have_count(1)
        expect(drift.locator(".cause")).to_have_text("tool result truncated")
        expect(drift.locator(".new .drift-text")).to_contain_text("[... truncated]")
        expect(drift.locator(".old .drift-text")).to_contain_text("file9.txt")
        # decoded ids, not id marks: the tokenizer's text around the difference
        expect(drift.locator(".new .drift-ids")).not_to_contain_text("\u2039")
        expect(drift.locator(".new .drift-ids")).to_contain_text("truncated")
        page.screenshot(path=ARTIFACTS / "ui-drift.png", full_page=True)
        browser.close()
        assert errors == []
