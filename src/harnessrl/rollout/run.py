"""`harnessrl run` put together: the proxy in front of the engine, the runner, the live
progress and the per-harness summary, all writing into one run directory."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from harnessrl.harnesses.policy import OraclePolicy
from harnessrl.proxy.app import Proxy
from harnessrl.proxy.serve import in_thread
from harnessrl.proxy.sessions import Sessions
from harnessrl.proxy.store import TraceStore
from harnessrl.rollout.progress import RunProgress, summary
from harnessrl.rollout.runner import RunConfig, Runner
from harnessrl.rollout.tasks import Task
from harnessrl.types import Outcome, Sampling


def oracle_policy(tasks: Sequence[Task]) -> OraclePolicy:
    """Each task's reference solution, keyed by its instruction's first line (harnesses may
    quote or wrap the instruction, but keep that line)."""
    solutions = {}
    for task in tasks:
        if task.solution_dir is not None:
            script = (task.solution_dir / "solve.sh").read_text()
        else:
            script = "\n".join(task.solution_commands)
        # base64 through bash: the harness's shell may be sh, and the script's quoting
        # must survive whatever the harness wraps around the command.
        encoded = base64.b64encode(script.encode()).decode()
        solutions[task.instruction.strip().splitlines()[0][:100]] = (
            f"echo {encoded} | base64 -d | bash")
    return OraclePolicy(solutions)


def execute(config: RunConfig, engine: Any, run_dir: Path, *,
            sampling: Sampling | None = None, console: Console | None = None) -> list[Outcome]:
    console = console or Console()
    run_dir.mkdir(parents=True, exist_ok=True)
    store = TraceStore(run_dir)
    proxy = Proxy(engine, Sessions(store, sampling=sampling))
    try:
        with in_thread(proxy.app()) as (url, _server):
            runner = Runner(config, store, url, run_dir)
            todo = runner.pending()
            skipped = len(config.harnesses) * len(config.tasks) * config.samples - len(todo)
            if skipped:
                console.print(f"resuming: {skipped} rollouts already have an outcome")
            with RunProgress(len(todo)) as progress:
                runner.on_outcome = progress.update
                asyncio.run(runner.run(todo))
        outcomes = store.outcomes()
    finally:
        store.close()
    console.print(summary(outcomes))
    console.print(f"store: {store.path}")
    return outcomes
