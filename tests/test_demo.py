"""The demo's embedded config: everything it names exists, and its shaping gives GRPO a
signal when the whole group fails (the run itself is the README's main-job command)."""

from __future__ import annotations

from pathlib import Path

from harnessrl.demo import brevity, demo_config
from harnessrl.harnesses import get
from harnessrl.rollout.rewards import TraceStats
from harnessrl.rollout.tasks import Verdict, load_tasks
from harnessrl.train.config import shaping_of


def test_demo_config_names_real_tasks_harnesses_and_terms(tmp_path: Path) -> None:
    config = demo_config(tmp_path, None)
    tasks = load_tasks(config.rollout.tasks)
    assert len(tasks) >= config.grpo.tasks_per_step
    assert [get(name).name for name in config.rollout.harnesses] == ["mini-swe-agent"]
    assert config.model.path == "smollm2" and config.grpo.steps == 2
    assert set(shaping_of(config.shaping).custom) == {"brevity"}


def test_failed_rollouts_of_different_length_get_different_rewards() -> None:
    shaping = shaping_of(demo_config(Path("unused"), None).shaping)
    failed = Verdict(reward=0.0, passed=False, output="1 failed", seconds=1.0)
    short, long = (shaping.reward(failed, TraceStats(turns=2, tool_calls=0,
                                                     completion_tokens=n))[0]
                   for n in (100, 900))
    assert short > long and short == brevity(failed, TraceStats(2, 0, 100))
