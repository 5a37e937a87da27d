"""`harnessrl run/eval --cluster ray` put together: the run's store on the driver, the
rollout nodes on the cluster, the live progress with one row per node, the summary."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from harnessrl.proxy.engines.base import Engine
from harnessrl.proxy.engines.build import EngineSettings, make
from harnessrl.rollout.cluster.driver import ClusterRunner, ClusterSettings, Node
from harnessrl.rollout.cluster.node import EngineFactory
from harnessrl.rollout.progress import summary
from harnessrl.rollout.runner import RunSettings
from harnessrl.store.writer import TraceStore
from harnessrl.types import Outcome, Sampling


def engines_from(specs: Sequence[EngineSettings], template: str | None = None
                 ) -> list[Engine]:
    """The engines of `specs`, built where this runs (on each node): pass
    `functools.partial(engines_from, specs, spec.template_text())` as a node's engine
    factory (the chat template's text travels with it: a node need not have the file)."""
    return [make(spec, template=template) for spec in specs]


class NodeProgress:
    """The run's progress bar with one row per rollout node: finished, running, lost."""

    def __init__(self, total: int, console: Console) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console)
        self.total = self.progress.add_task("rollouts", total=total, detail="")
        self.rows: dict[str, TaskID] = {}
        self.outcomes: list[Outcome] = []

    def __enter__(self) -> NodeProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(None, None, None)

    def outcome(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        done = [o for o in self.outcomes if o.status == "done"]
        passed = sum(1 for o in done if (o.verifier_reward or 0) >= 1)
        self.progress.update(self.total, advance=1, detail=(
            f"pass {passed}/{len(done)} · turns {sum(o.turns for o in self.outcomes)} · "
            f"infra errors {len(self.outcomes) - len(done)}"))

    def node(self, node: Node) -> None:
        if node.id not in self.rows:
            self.rows[node.id] = self.progress.add_task(f"node {node.short}", total=None,
                                                        detail="")
        state = "" if node.alive else " · [red]dead[/]"
        self.progress.update(self.rows[node.id], completed=node.finished, detail=(
            f"{node.running}/{node.slots} running · lost {node.lost}{state}"))


def execute_on_cluster(config: RunSettings, engine_factory: EngineFactory, run_dir: Path,
                       cluster: ClusterSettings, *, sampling: Sampling | None = None,
                       console: Console | None = None) -> list[Outcome]:
    """`rollout.run.execute` on a Ray cluster: same run directory, same resume, same
    summary; each node builds its shard's engine(s) with `engine_factory`."""
    console = console or Console()
    run_dir.mkdir(parents=True, exist_ok=True)
    with TraceStore(run_dir) as store, ClusterRunner(
            config, store, run_dir, engine_factory, cluster, sampling=sampling) as runner:
        todo = runner.pending()
        skipped = len(config.harnesses) * len(config.tasks) * config.samples - len(todo)
        if skipped:
            console.print(f"resuming: {skipped} rollouts already have an outcome")
        if todo:  # nothing to run places no node
            with console.status("starting the rollout nodes on Ray"):
                runner.start()
            console.print(f"{len(runner.nodes)} rollout nodes, "
                          f"{sum(n.slots for n in runner.nodes)} slots")
            with NodeProgress(len(todo), console) as progress:
                runner.on_outcome = progress.outcome
                runner.on_node = progress.node
                for node in runner.nodes:
                    progress.node(node)
                asyncio.run(runner.run(todo))
        outcomes = store.outcomes()
        path = store.path
    console.print(summary(outcomes))
    console.print(f"store: {path}")
    return outcomes
