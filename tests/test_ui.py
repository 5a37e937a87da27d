"""The trace viewer: paginated queries that never read a run whole, and the page itself in
headless Chromium (Debian's package, driven by Playwright) over a real rollout batch."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from starlette.testclient import TestClient

from harnessrl.store.reader import TraceReader
from harnessrl.store.writer import TraceStore
from harnessrl.types import (
    ChatRequest,
    Completion,
    Message,
    Outcome,
    Rollout,
    Text,
    Timings,
    Tokens,
    ToolCall,
    Turn,
    Usage,
)
from harnessrl.ui import views
from harnessrl.ui.app import build_app
from harnessrl.ui.queries import MAX_PAGE, Filters, RunReader
from harnessrl.ui.tokens import Decoder, token_view

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("HARNESSRL_ARTIFACTS", ROOT / "tests" / "artifacts"))
TOOLS = Path("~/.cache/harnessrl/tools").expanduser()


# ------------------------------------------------------------------ a synthetic store
def _turn(key: str, index: int, history: list[Message], prompt: tuple[int, ...]) -> Turn:
    reply = (Text(f"reply {index}"), ToolCall(f"c{index}", "bash", '{"cmd": "ls"}'))
    completion_ids = (7, 8, 9, index)
    tokens = Tokens(prompt, completion_ids, tuple(-0.25 * (i + 1) for i in range(4)))
    return Turn(
        rollout=key, index=index, dialect="openai_chat", status="ok",
        timings=Timings(100.0 + index, 100.5 + index, 101.0 + index),
        raw_request=b'{"messages": [%d]}' % index, raw_response=b'{"id": "x"}',
        request=ChatRequest(model="m", messages=tuple(history)),
        completion=Completion("m", reply, "tool_calls", Usage(len(prompt), 4), tokens),
        model="m", engine="scripted")


def build_store(run_dir: Path, rollouts: int, turns: int) -> TraceStore:
    """`rollouts` rollouts of `turns` turns each, every turn extending the one before, and
    an outcome for each rollout (passed when its number is even)."""
    store = TraceStore(run_dir)

    async def fill() -> None:
        for r in range(rollouts):
            key = f"k{r:04d}"
            harness = "alpha" if r % 2 else "beta"
            await store.put_rollout(Rollout(key, 1000.0 + r, 2000.0 + r, metadata={
                "harness": harness, "task": f"task{r % 5}", "sample": r, "attempt": 1}))
            history = [Message("user", (Text("do it"),))]
            prompt: tuple[int, ...] = (1, 2, 3)
            writes = []
            for i in range(turns):
                turn = _turn(key, i, history, prompt)
                writes.append(store.add_turn(turn))
                assert turn.completion is not None
                history = [*history, Message("assistant", turn.completion.parts),
                           Message("user", (Text(f"result {i}"),))]
                prompt = (*prompt, *(turn.completion.tokens.completion_ids or ()), 50, 51)
            await asyncio.gather(*writes)
            verifier = 1.0 if r % 2 == 0 else 0.0
            await store.put_outcome(Outcome(
                harness=harness, harness_version="1", task=f"task{r % 5}", sample=r, rollout=key,
                status="done", reward=verifier + 0.1 * verifier, verifier_reward=verifier,
                shaping={"fewer_tool_calls": 0.1 * verifier}, turns=turns, tool_calls=turns,
                completion_tokens=4 * turns, verifier_output="1 passed"))

    asyncio.run(fill())
    return store


@pytest.fixture(scope="module")
def big_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("big")
    build_store(run_dir, rollouts=60, turns=40).close()  # 2,400 turns
    return run_dir


def _plans(db: sqlite3.Connection, statements: list[str]) -> list[str]:
    """Query plans of statements as traced (their parameters already written in)."""
    return [" | ".join(r[-1] for r in db.execute(f"EXPLAIN QUERY PLAN {sql}"))
            for sql in statements]


def test_every_page_query_is_bounded_and_reads_turns_only_through_an_index(big_run: Path):
    reader = RunReader(big_run)
    seen: list[str] = []
    reader.db.set_trace_callback(seen.append)
    page = reader.rollouts(Filters(), offset=10, limit=7)
    assert page["total"] == 60 and len(page["rows"]) == 7 and page["offset"] == 10
    assert [r["key"] for r in page["rows"]] == [f"k{r:04d}" for r in range(49, 42, -1)]
    huge = reader.rollouts(Filters(), 0, 10**9)  # a client cannot ask for everything
    assert huge["limit"] == MAX_PAGE and len(huge["rows"]) == min(60, MAX_PAGE)
    turns = reader.turns("k0003", offset=30, limit=4)
    assert [t.index for t in turns] == [30, 31, 32, 33]
    assert len(reader.turns("k0003", 0, 10**9)) == 40 and MAX_PAGE < 2400
    filtered = reader.rollouts(Filters(harness="alpha", state="failed"), 0, 100)
    assert filtered["total"] == 30 and {r["harness"] for r in filtered["rows"]} == {"alpha"}
    summary = reader.summary()
    assert summary["turns"] == 2400 and summary["models"] == [{"model": "m", "turns": 2400}]
    reader.facets()
    reader.rollout("k0001")
    reader.token_turns("k0001")
    reader.db.set_trace_callback(None)
    statements = [s for s in seen if s.lstrip().upper().startswith("SELECT")]
    assert len(statements) >= 10
    for sql, plan in zip(statements, _plans(reader.db, statements), strict=True):
        # A plain SCAN of the turns table reads every turn's blobs: never on a page.
        scans = re.findall(r"SCAN (turns|t)\b(?! USING COVERING INDEX)", plan)
        assert not scans, f"{sql}\n-> {plan}"
        if "LIMIT" not in sql and "FROM turns" in sql and "COUNT" not in sql \
                and "GROUP BY" not in sql:
            assert "WHERE rollout = '" in sql, sql  # unpaged reads stay in one rollout


def test_a_store_without_the_viewer_indexes_gets_them_when_opened(tmp_path: Path):
    build_store(tmp_path, rollouts=2, turns=2).close()
    with sqlite3.connect(tmp_path / "trace.db") as db:
        db.execute("DROP INDEX turns_by_model")
    plan = _plans(RunReader(tmp_path).db, ["SELECT model, COUNT(*) FROM turns GROUP BY model"])
    assert plan == ["SCAN turns USING COVERING INDEX turns_by_model"]


def test_api_pages_match_the_store(big_run: Path):
    client = TestClient(build_app(big_run.parent))
    runs = client.get("/api/runs").json()["runs"]
    run = next(r for r in runs if r["path"] == str(big_run.resolve()))
    beta = next(h for h in run["harnesses"] if h["harness"] == "beta")
    assert beta["outcomes"] == 30 and beta["passed"] == 30 and beta["pass_rate"] == 1.0
    assert beta["tool_calls_per_solved"] == 40 and sum(beta["rewards"]["counts"]) == 30
    rows = client.get("/api/rollouts", params={"run": run["id"], "limit": 5,
                                               "task": "task2"}).json()
    assert rows["total"] == 12 and len(rows["rows"]) == 5
    assert all(r["task"] == "task2" for r in rows["rows"])
    page = client.get("/api/turns", params={"run": run["id"], "key": "k0002", "offset": 5,
                                            "limit": 3}).json()
    assert page["total"] == 40 and [t["index"] for t in page["rows"]] == [5, 6, 7]
    # Each turn shows only what it added: the tool result after the echoed reply.
    assert page["rows"][0]["history"] == "extends"
    assert [m["role"] for m in page["rows"][0]["messages"]] == ["user"]
    assert page["rows"][0]["messages"][0]["parts"][0]["text"] == "result 4"
    assert client.get("/api/rollouts", params={"run": "nope"}).status_code == 404


def test_tokens_without_a_tokenizer_show_ids_and_no_text(big_run: Path):
    reader = RunReader(big_run)
    view = token_view(reader.token_turns("k0004"), 3, Decoder(None), "m")
    assert view is not None and view["tokenizer"] is None and "--tokenizer" in \
        view["tokenizer_problem"]
    assert view["completion"]["ids"] == [7, 8, 9, 3] and view["completion"]["text"] is None
    assert view["completion"]["logprobs"] == [-0.25, -0.5, -0.75, -1.0]
    ctx = view["context"]  # what the environment inserted after turn 2: masked
    assert ctx["kind"] == "inserted" and ctx["from_turn"] == 2 and ctx["ids"] == [50, 51]
    assert ctx["text"] is None
    assert [c["turns"] for c in view["chains"]] == [list(range(40))]


def _broken_rollout(key: str) -> list[Turn]:
    """Turn 1 extends turn 0; turn 2 rewrites turn 0's reply (a break inside a completion);
    turn 3 failed."""
    history = [Message("user", (Text("go"),))]
    t0 = _turn(key, 0, history, (1, 2, 3))
    t1 = _turn(key, 1, history, (1, 2, 3, 7, 8, 9, 0, 50, 51))
    t2 = _turn(key, 2, history, (1, 2, 3, 7, 99, 50, 51))
    t3 = msgspec.structs.replace(_turn(key, 3, history, (1, 2)), status="failed",
                                 error="engine_error: boom")
    return [t0, t1, t2, t3]


def test_chain_breaks_and_excluded_turns_are_explained():
    view = token_view(_broken_rollout("k"), 2, Decoder(None), None)
    assert view is not None
    assert [c["turns"] for c in view["chains"]] == [[0, 1], [2]]
    start = view["chains"][1]["start"]
    assert start == {"reason": "history_rewritten", "turn": 2, "against": 1, "diverged_at": 4,
                     "within": "completion", "within_turn": 0}
    assert "re-tokenization" in view["chains"][1]["why"]
    assert view["excluded"][0]["turn"] == 3 and view["excluded"][0]["reason"] == "failed"
    ctx = view["context"]
    assert ctx["kind"] == "prompt" and ctx["ids"] == [1, 2, 3, 7, 99, 50, 51]
    assert ctx["diverged_at"] == 4


def test_history_that_diverges_is_shown_from_where_it_differs():
    a = [Message("user", (Text("x"),)), Message("assistant", (Text("y"),))]
    b = [Message("user", (Text("x"),)), Message("user", (Text("z"),))]
    turn0 = _turn("k", 0, a, (1,))
    turn1 = _turn("k", 1, b, (1,))
    shown = views.summaries([turn0, turn1], None)
    assert shown[0]["history"] == "first" and len(shown[0]["messages"]) == 2
    assert shown[1]["history"] == "diverges" and shown[1]["shown_from"] == 1
    assert [m["parts"][0]["text"] for m in shown[1]["messages"]] == ["z"]


def test_long_texts_are_clipped_with_a_marker():
    clipped = views.clip({"a": ["x" * 30_000]})
    assert clipped["a"][0].startswith("x" * views.CLIP)
    assert "10000 more characters" in clipped["a"][0]


# ------------------------------------------------------------------ the page, in a browser
def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("Debian's chromium is not installed (scripts/bootstrap.sh installs it)")
    return path


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real rollout batch: two harnesses (two dialects) on two bundled tasks, driven by
    the oracle policy through the proxy and scored by the tasks' verifiers."""
    from rich.console import Console

    from harnessrl.harnesses import get
    from harnessrl.proxy.engines.scripted import ScriptedEngine
    from harnessrl.rollout.conformance import policy_tokenizer
    from harnessrl.rollout.rewards import Shaping
    from harnessrl.rollout.run import execute, oracle_policy
    from harnessrl.rollout.runner import RolloutSettings, RunSettings
    from harnessrl.rollout.tasks.task import load_tasks

    harnesses = [get("mini-swe-agent"), get("claude")]
    for harness in harnesses:
        harness.install(TOOLS, log=lambda _line: None)
    tasks = load_tasks("bundled:create-hello-file,fizzbuzz")
    root = tmp_path_factory.mktemp("runs")
    config = RunSettings(harnesses=harnesses, tasks=tasks, samples=1,
                       settings=RolloutSettings(concurrency=2, tools_dir=str(TOOLS)),
                       shaping=Shaping(fewer_tool_calls=0.1))
    engine = ScriptedEngine(policy_tokenizer(), oracle_policy(tasks), model="oracle")
    outcomes = execute(config, engine, root / "batch",
                       console=Console(file=open(os.devnull, "w")))  # noqa: SIM115
    assert len(outcomes) == 4 and all(o.status == "done" for o in outcomes)
    return root


def _tokenizer_dir() -> Path:
    from harnessrl.models.tiny import build_tiny_model

    # The scripted engine speaks through this model's tokenizer (policy_tokenizer).
    return build_tiny_model(Path("~/.cache/harnessrl/models/tiny-qwen2").expanduser())


@pytest.mark.slow
@pytest.mark.harness
def test_browse_runs_rollout_and_tokens_and_they_match_the_store(batch: Path):
    from playwright.sync_api import expect, sync_playwright
    from transformers import AutoTokenizer

    from harnessrl.proxy.serve import in_thread

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with TraceReader(batch / "batch") as store:
        outcomes = {o.rollout: o for o in store.outcomes()}
        mini = next(o for o in outcomes.values()
                    if o.harness == "mini-swe-agent" and o.task == "fizzbuzz")
        turns = store.turns(mini.rollout)
    tokenizer_dir = _tokenizer_dir()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    live = TraceStore(batch / "live")  # a second run, written while the page is open
    with in_thread(build_app(batch, str(tokenizer_dir))) as (url, _server), \
            sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium())
        page = browser.new_page(viewport={"width": 1360, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))

        # Runs: both run directories, pass rate per harness from the outcomes.
        page.goto(url)
        card = page.locator('.run[data-run="batch"]')
        expect(card).to_be_visible()
        expect(page.locator('.run[data-run="live"]')).to_be_visible()
        expect(card.locator(".progress")).to_contain_text("4 rollouts with an outcome")
        expect(card.locator("td.pass-rate")).to_have_text(["100%", "100%"])
        expect(card.locator("svg.hist")).to_have_count(2)
        # Live: an outcome recorded now shows up without reloading the page.
        _in_thread(_one_outcome(live))  # Playwright's own loop runs in this thread
        expect(page.locator('.run[data-run="live"] .progress')).to_contain_text(
            "1 rollouts with an outcome", timeout=10_000)
        page.screenshot(path=ARTIFACTS / "ui-runs.png", full_page=True)

        # Rollouts: one row per rollout, rewards as stored.
        card.locator("h2 a").click()
        rows = page.locator("tr.rollout-row")
        expect(rows).to_have_count(4)
        for key, outcome in outcomes.items():
            row = page.locator(f'tr.rollout-row[data-key="{key}"]')
            expect(row.locator("td.reward")).to_have_text(f"{outcome.reward:.3f}")
        page.select_option('select[name="harness"]', "claude")
        expect(rows).to_have_count(2)
        page.select_option('select[name="harness"]', "mini-swe-agent")
        expect(rows).to_have_count(2)
        page.screenshot(path=ARTIFACTS / "ui-rollouts.png", full_page=True)

        # One rollout: its turns, reward breakdown, verifier output, raw bodies.
        page.locator(f'tr.rollout-row[data-key="{mini.rollout}"]').click()
        expect(page.locator(".turn")).to_have_count(len(turns))
        expect(page.locator(".outcome .breakdown td.reward")).to_have_text(f"{mini.reward:.3f}")
        expect(page.locator("pre.verifier")).to_contain_text("passed")
        first = page.locator('.turn[data-index="0"]')
        expect(first.locator(".tool-call")).to_contain_text("bash")
        first.locator(".btn-raw-request").click()
        expect(first.locator(".raw-request pre")).to_contain_text('"messages"')
        page.get_by_role("button", name="harness dialect").click()
        expect(page.locator(".native-item").first).to_be_visible()
        page.screenshot(path=ARTIFACTS / "ui-rollout.png", full_page=True)

        # Tokens of turn 1: ids and logprobs exactly as stored, inserted ids apart.
        page.locator('.turn[data-index="1"] .tokens-link').click()
        spans = page.locator(".completion-tokens .tok")
        tokens = turns[1].completion.tokens  # type: ignore[union-attr]
        expect(spans).to_have_count(len(tokens.completion_ids))
        shown_ids = [int(i) for i in spans.evaluate_all("els => els.map(e => e.dataset.id)")]
        shown_lps = [float(x) for x in spans.evaluate_all("els => els.map(e => e.dataset.lp)")]
        assert shown_ids == list(tokens.completion_ids)
        assert shown_lps == list(tokens.logprobs)
        texts = spans.evaluate_all("els => els.map(e => e.textContent)")
        assert [t.replace("↵", "") for t in texts] == [
            tokenizer.decode([i]) for i in tokens.completion_ids]
        before = turns[0].completion.tokens  # type: ignore[union-attr]
        start = len(before.prompt_ids) + len(before.completion_ids)
        masked = page.locator(".ctx-tokens .tok.masked")
        assert [int(i) for i in masked.evaluate_all("els => els.map(e => e.dataset.id)")] == \
            list(tokens.prompt_ids[start:])
        expect(page.locator(".chain")).to_have_count(1)
        expect(page.locator(".chain .chip")).to_have_text(["0", "1"])
        spans.first.hover()
        assert f"logprob {tokens.logprobs[0]:.4f}" in spans.first.get_attribute("title")
        page.screenshot(path=ARTIFACTS / "ui-tokens.png", full_page=True)
        if os.environ.get("HARNESSRL_UPDATE_DOCS"):
            page.screenshot(path=ROOT / "docs" / "ui.png")

        # Compare: the same task under the other harness, side by side.
        page.go_back()
        page.select_option('select[name="compare"]', index=1)
        expect(page.locator(".compare-col")).to_have_count(2)
        expect(page.locator(".compare-col .reward")).to_have_text(
            [f"{o.reward:.3f}" for o in (mini, next(o for o in outcomes.values()
             if o.task == "fizzbuzz" and o.harness == "claude"))])
        page.screenshot(path=ARTIFACTS / "ui-compare.png", full_page=True)
        browser.close()
        assert errors == []
    live.close()


def _in_thread(coroutine: Any) -> None:
    worker = threading.Thread(target=asyncio.run, args=(coroutine,))
    worker.start()
    worker.join(30)


async def _one_outcome(store: TraceStore) -> None:
    now = time.time()
    await store.put_rollout(Rollout("live-1", now, now + 1, metadata={"harness": "h",
                                                                       "task": "t"}))
    await store.put_outcome(Outcome(harness="h", harness_version="1", task="t", sample=0,
                                    rollout="live-1", status="done", reward=0.0,
                                    verifier_reward=0.0))


@pytest.mark.slow
def test_browse_pages_breaks_and_ids_without_a_tokenizer(tmp_path: Path):
    from playwright.sync_api import expect, sync_playwright

    from harnessrl.proxy.serve import in_thread

    build_store(tmp_path / "paged", rollouts=60, turns=2).close()
    store = TraceStore(tmp_path / "breaks")
    turns = _broken_rollout("hrl-broken")

    async def write() -> None:
        await store.put_rollout(Rollout("hrl-broken", 5.0, None, metadata={"harness": "h"}))
        await asyncio.gather(*(store.add_turn(t) for t in turns))

    _in_thread(write())
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with in_thread(build_app(tmp_path)) as (url, _server), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium())
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{url}/#/rollouts?run=paged")
        rows = page.locator("tr.rollout-row")
        expect(rows).to_have_count(50)  # one page, not the whole run
        expect(page.locator(".pager")).to_contain_text("1\u201350 of 60")
        page.get_by_role("link", name="next \u203a").click()
        expect(rows).to_have_count(10)
        expect(rows.first).to_have_attribute("data-key", "k0009")

        page.goto(f"{url}/#/rollouts?run=breaks")
        expect(rows.locator(".badge")).to_have_text(["running"])  # no outcome yet, open
        rows.first.click()
        expect(page.locator(".turn.failed")).to_contain_text("engine_error: boom")
        # Live: a turn made now is appended; the rollout's end redraws the page.
        later = _turn("hrl-broken", 4, [Message("user", (Text("again"),))], (5, 6))
        _in_thread(store.add_turn(later))
        expect(page.locator(".turn")).to_have_count(5, timeout=10_000)
        _in_thread(store.put_rollout(Rollout("hrl-broken", 5.0, 6.0, metadata={"harness": "h"})))
        expect(page.locator("h1 .badge")).to_have_text("no outcome", timeout=10_000)
        page.locator('.turn[data-index="2"] .tokens-link').click()
        chains = page.locator(".chain")
        expect(chains).to_have_count(3)  # turn 4, made live, is another conversation
        expect(chains.nth(1)).to_have_attribute("data-reason", "history_rewritten")
        expect(chains.nth(2)).to_have_attribute("data-reason", "side_call")
        expect(chains.nth(1)).to_contain_text("at token 4 (in the completion of turn 0)")
        expect(page.locator(".chip.excl")).to_have_text(["3: failed"])
        diverge = page.locator(".ctx-tokens .tok.diverge")  # prompt position 4: id 99
        expect(diverge).to_have_count(1)
        expect(diverge).to_have_attribute("data-id", "99")
        expect(page.locator(".note")).to_contain_text("--tokenizer")
        # No tokenizer: ids, never made-up text.
        expect(page.locator(".completion-tokens .tok")).to_have_text(
            [f"\u2039{i}\u203a" for i in (7, 8, 9, 2)])  # the page's id marks
        page.screenshot(path=ARTIFACTS / "ui-breaks.png", full_page=True)
        browser.close()
        assert errors == []
    store.close()


def test_ui_command_binds_loopback_by_default():
    from harnessrl.cli import build_parser

    args = build_parser().parse_args(["ui", "some/run"])
    assert args.host == "127.0.0.1" and args.run_dir == Path("some/run")
    assert args.tokenizer is None
