"""A runner process for tests/test_docker.py to kill: `harnessrl run`'s pipeline (proxy,
runner, docker sandbox) on one bundled task with a harness whose agent only sleeps, so
the rollout is mid-way when the test signals it.

Usage: python tests/docker_child.py RUN_DIR TOOLS_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from harnessrl.harnesses.base import Harness
from harnessrl.rollout.run import execute, oracle_engine
from harnessrl.rollout.runner import RolloutSettings, RunSettings
from harnessrl.rollout.tasks.task import load_tasks

SLEEPER = Harness(name="sleeper", version="1", dialect="openai_chat", registry="pypi",
                  package="sleeper", binary="sleeper")


def install_sleeper(tools: Path) -> None:
    executable = SLEEPER.executable(tools)
    executable.parent.mkdir(parents=True, exist_ok=True)
    executable.write_text("#!/bin/sh\necho agent-started\nexec sleep 600\n")
    executable.chmod(0o755)


def main(run_dir: Path, tools: Path) -> None:
    install_sleeper(tools)
    tasks = load_tasks("bundled:fizzbuzz")
    settings = RolloutSettings(sandbox="docker", tools_dir=str(tools), retries=0)
    config = RunSettings(harnesses=[SLEEPER], tasks=tasks, settings=settings)
    execute(config, oracle_engine(tasks), run_dir, console=Console(file=sys.stderr))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
