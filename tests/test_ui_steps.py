"""The viewer's per-step curves over a recorded training run: its metrics.jsonl written by
the trainer's own line builders (`async_grpo.loop.step_line` from TRL-shaped logs, an eval
pass's `EvalPass.line`), read back by the API and drawn by the page (Playwright on
Debian's chromium)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from harnessrl.rollout.evaluate import HarnessEval
from harnessrl.store.writer import TraceStore
from harnessrl.train.async_grpo.loop import step_line
from harnessrl.train.runs.eval_during import EvalPass
from harnessrl.ui.app import build_app

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("HARNESSRL_ARTIFACTS", ROOT / "tests" / "artifacts"))
STEPS = 6


def _logs(step: int) -> dict[str, Any]:
    """What TRL's log holds at a step of an async run (two harnesses)."""
    return {
        "reward": 0.1 * step, "loss": 0.01, "kl": 1e-4 * step,
        "clip_ratio/region_mean": 0.0,
        "harnessrl/groups_with_spread": 0.25 + 0.1 * step,
        "harnessrl/advantage_abs": 0.8, "harnessrl/advantage_range": 2.0,
        "harnessrl/replies_truncated": 0.05, "harnessrl/replies_rejected": 0.02 * step,
        "harnessrl/groups_uniform_total": float(step % 3),
        "harnessrl/agent_timeouts_total": 1.0 if step == 4 else 0.0,
        "harnessrl/step_rows": 10.0 + step, "harnessrl/step_groups": 2.0,
        "harnessrl/step_trained_tokens": 500.0 + step,
        "harnessrl/kl_to_sampler": 2e-3, "harnessrl/is_masked_fraction": 0.01 * step,
        "harnessrl/mini-swe-agent/pass_rate": 0.5, "harnessrl/aider/pass_rate": 0.1 * step,
        # step 3 had no gradient
        **({"harnessrl/steps_without_gradient_total": 1.0} if step == 3 else {}),
    }


def _eval(step: int, passed: int) -> dict[str, Any]:
    row = HarnessEval(harness="mini-swe-agent", version="1", tasks=10, rollouts=10,
                      passed=passed, pass_rate=passed / 10, ci_low=max(0.0, passed / 10 - 0.2),
                      ci_high=min(1.0, passed / 10 + 0.2), pass_at_k=None, k=1,
                      tool_calls_per_solved=None, tokens_per_solved=None, infra_errors=0)
    return EvalPass(step, [row], 3.0, ["v1"]).line()


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    TraceStore(run).close()
    lines = [step_line(s, _logs(s), f"v{s}") for s in range(1, STEPS + 1)]
    lines.insert(2, _eval(2, 3))
    lines.append(_eval(STEPS, 6))
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines)
                                       + '{"step": 7, "rew')  # a line being written
    return tmp_path


def _chart(data: dict[str, Any], name: str) -> dict[str, list[list[float]]]:
    [chart] = [c for c in data["charts"] if c["name"] == name]
    return {s["name"]: s["points"] for s in chart["series"]}


def test_the_api_gives_each_curve_per_step_as_recorded(recorded: Path):
    data = TestClient(build_app(recorded)).get("/api/steps", params={"run": "run"}).json()
    assert data["steps"] == STEPS
    assert _chart(data, "reward")["reward"] == [[s, pytest.approx(0.1 * s)]
                                                for s in range(1, STEPS + 1)]
    per_harness = _chart(data, "pass rate per harness")
    assert per_harness["aider"][-1] == [STEPS, pytest.approx(0.6)]
    assert set(per_harness) == {"aider", "mini-swe-agent"}
    spread = _chart(data, "groups with a reward spread")["share"]
    assert [p[1] for p in spread] == pytest.approx([0.25 + 0.1 * s for s in range(1, 7)])
    untrained = _chart(data, "groups and rollouts not trained")
    assert [p[1] for p in untrained["steps without gradient"]] == [0, 0, 1, 0, 0, 0]
    assert [p[1] for p in untrained["agent timeouts"]] == [0, 0, 0, 1, 0, 0]
    assert _chart(data, "rows per step")["rows"][0] == [1, 11.0]
    assert data["eval"] == [{"harness": "mini-swe-agent", "points": [
        [2, 0.3, pytest.approx(0.1), pytest.approx(0.5)], [6, 0.6, pytest.approx(0.4),
                                                           pytest.approx(0.8)]]}]
    # a run that trained nothing has no curves (and no error)
    TraceStore(recorded / "plain").close()
    empty = TestClient(build_app(recorded)).get("/api/steps", params={"run": "plain"}).json()
    assert empty == {"steps": 0, "charts": [], "eval": []}


def js(x: float) -> str:
    """A number as JavaScript's String() writes it (both print the shortest repr)."""
    return repr(x).removesuffix(".0")


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("Debian's chromium is not installed (scripts/bootstrap.sh installs it)")
    return path


@pytest.mark.slow
def test_the_run_page_plots_the_recorded_steps(recorded: Path):
    from playwright.sync_api import expect, sync_playwright

    from harnessrl.proxy.serve import in_thread

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with in_thread(build_app(recorded)) as (url, _server), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium())
        page = browser.new_page(viewport={"width": 1360, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(url)
        card = page.locator('.run[data-run="run"]')
        expect(card.locator("h3", has_text="per step")).to_have_text("per step (6 steps)")
        reward = card.locator('[data-chart="reward"] polyline[data-series="reward"]')
        expect(reward).to_have_attribute(
            "data-points", ",".join(f"{s}:{js(0.1 * s)}" for s in range(1, 7)))
        expect(card.locator('[data-chart="reward"] circle')).to_have_count(STEPS)
        harness = card.locator('[data-chart="pass rate per harness"] polyline')
        expect(harness).to_have_count(2)
        evals = card.locator('[data-chart="eval pass@1 (95% interval)"]')
        expect(evals.locator("polygon.band")).to_have_count(1)  # the interval
        expect(evals.locator("polyline")).to_have_attribute("data-points", "2:0.3,6:0.6")
        for name in ("groups with a reward spread", "KL to the sampler",
                     "clipped and masked tokens", "replies cut or dropped",
                     "groups and rollouts not trained", "trained tokens per step"):
            expect(card.locator(f'[data-chart="{name}"] polyline')).not_to_have_count(0)
        nograd = card.locator('[data-chart="groups and rollouts not trained"] '
                              'polyline[data-series="steps without gradient"]')
        expect(nograd).to_have_attribute("data-points", "1:0,2:0,3:1,4:0,5:0,6:0")
        page.screenshot(path=ARTIFACTS / "ui-steps.png", full_page=True)
        browser.close()
    assert errors == []
