"""`harnessrl run` put together: the proxy in front of the engine, the runner, the live
progress and the per-harness summary, all writing into one run directory."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from harnessrl.harnesses.base import Harness
from harnessrl.proxy.engines.base import Engine
from harnessrl.proxy.engines.policy import OraclePolicy
from harnessrl.rollout.progress import RunProgress, summary
from harnessrl.rollout.runner import RunSettings
from harnessrl.rollout.sandbox import registry
from harnessrl.rollout.serving import serving
from harnessrl.rollout.tasks.task import Task, prepare, run_solution
from harnessrl.types import Outcome, Sampling

if TYPE_CHECKING:
    from harnessrl.proxy.engines.scripted import ScriptedEngine


def oracle_policy(tasks: Sequence[Task], *, listings: bool = False) -> OraclePolicy:
    """Each task's reference solution, keyed by its instruction's first line (harnesses may
    quote or wrap the instruction, but keep that line); with `listings`, also the files
    it writes, for harnesses that only write files (see `OraclePolicy`)."""
    solutions = {}
    for task in tasks:
        if task.solution_dir is not None:
            script = (task.solution_dir / "solve.sh").read_text()
        else:
            script = "\n".join(task.solution_commands)
        # base64 through bash: the harness's shell may be sh, and the script's quoting
        # must survive whatever the harness wraps around the command.
        encoded = base64.b64encode(script.encode()).decode()
        solutions[_key(task)] = f"echo {encoded} | base64 -d | bash"
    written = asyncio.run(_all_written(tasks)) if listings else {}
    return OraclePolicy(solutions, written)


def _key(task: Task) -> str:
    return task.instruction.strip().splitlines()[0][:100]


async def _all_written(tasks: Sequence[Task]) -> dict[str, dict[str, str]]:
    with tempfile.TemporaryDirectory(prefix="hrl-oracle-") as root:
        return {_key(t): await written_by_solution(t, Path(root), f"t{n}")
                for n, t in enumerate(tasks)}


async def written_by_solution(task: Task, root: Path, name: str) -> dict[str, str]:
    """The text files the task's reference solution creates or changes in a fresh workdir
    (path relative to it -> text), found by running it once in a sandbox of its own."""
    sandbox = await registry.backend("local").sandbox(root, name, task)
    try:
        await prepare(task, sandbox)
        before = _files(sandbox.workdir)
        await run_solution(task, sandbox)
        after = _files(sandbox.workdir)
    finally:
        await sandbox.close()
    written = {}
    for path, data in after.items():
        if before.get(path) != data:
            with contextlib.suppress(UnicodeDecodeError):  # a binary file cannot be listed
                written[path] = data.decode("utf-8")
    return written


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def oracle_engine(tasks: Sequence[Task], harnesses: Sequence[Harness] = ()) -> ScriptedEngine:
    """The scripted engine that drives every harness with each task's reference solution
    (the files it writes worked out first when one of `harnesses` only writes files)."""
    from harnessrl.proxy.engines.scripted import ScriptedEngine
    from harnessrl.rollout.conformance import policy_tokenizer

    listings = any(h.finish == "whole-file" for h in harnesses)
    return ScriptedEngine(policy_tokenizer(), oracle_policy(tasks, listings=listings),
                          model="oracle")


def broken_pipeline(outcomes: Sequence[Outcome]) -> list[str]:
    """What went wrong in an oracle run, one line per rollout that did not pass. The
    reference solution passes by definition, so each is the pipeline's fault (sandbox,
    harness, proxy, verifier), never the model's."""
    problems = []
    for o in outcomes:
        where = f"{o.harness} on {o.task} (sample {o.sample})"
        if o.status != "done":
            problems.append(f"{where}: infrastructure error: {o.error}")
        elif (o.verifier_reward or 0) < 1:
            tail = " ".join((o.verifier_output or "").split()[-40:])
            problems.append(f"{where}: the reference solution did not pass (verifier "
                            f"{o.verifier_status}, reward {o.verifier_reward}; agent "
                            f"{o.agent_detail or '-'}): {tail}")
    return problems


def oracle_check(config: RunSettings, run_dir: Path, *,
                 console: Console | None = None) -> list[str]:
    """One oracle rollout per harness and task of `config`, in `run_dir`: the problems
    (empty when the whole pipeline works)."""
    once = dataclasses.replace(config, samples=1)
    return broken_pipeline(execute(once, oracle_engine(config.tasks, config.harnesses), run_dir,
                                   console=console))


def execute(config: RunSettings, engine: Engine, run_dir: Path, *,
            sampling: Sampling | None = None, console: Console | None = None) -> list[Outcome]:
    console = console or Console()
    with serving(config, engine, run_dir, sampling=sampling) as served:
        runner = served.runner
        todo = runner.pending()
        skipped = len(config.harnesses) * len(config.tasks) * config.samples - len(todo)
        if skipped:
            console.print(f"resuming: {skipped} rollouts already have an outcome")
        with RunProgress(len(todo)) as progress:
            runner.on_outcome = progress.update
            asyncio.run(runner.run(todo))
        outcomes = served.store.outcomes()
        path = served.store.path
    console.print(summary(outcomes))
    console.print(f"store: {path}")
    return outcomes
