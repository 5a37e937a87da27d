"""The runner: harnesses on tasks in sandboxes, through the capture proxy, scored by the
task's verifier, with rewards we shape.

Each planned rollout is (harness, task, sample). It gets a rollout key, a fresh sandbox,
the task's files, one headless harness run, then the verifier (tests copied in only now),
and an `Outcome` stored beside its turns. One deadline covers sandbox start, agent and
verifier. Infrastructure failures (sandbox, install, engine, verifier without a score) are
retried and reported apart from agent failures, which are results. A run is resumable:
started again on the same run directory it skips every rollout that has an outcome.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from harnessrl.errors import HarnessRLError
from harnessrl.harnesses.base import Harness, RunContext
from harnessrl.proxy.store import TraceStore
from harnessrl.rollout.docker import DockerSandbox
from harnessrl.rollout.rewards import Shaping, TraceStats
from harnessrl.rollout.sandbox import ExecResult, LocalSandbox, Network, SandboxError
from harnessrl.rollout.tasks import BUNDLED, Task, TaskError, Verdict, prepare, verify
from harnessrl.types import Outcome

# Turn errors that are the engine's fault, not the agent's (see errors.py kinds).
_ENGINE_FAILURES = frozenset({"engine_unavailable", "timeout", "engine_error"})
# Slack on top of the task's agent and verifier timeouts, for sandbox start and teardown.
DEADLINE_SLACK = 120.0


class InfraError(Exception):
    """Something outside the agent failed; the rollout is retried, never scored."""


@dataclass(frozen=True)
class RunConfig:
    harnesses: Sequence[Harness]
    tasks: Sequence[Task]
    samples: int = 1
    concurrency: int = 2
    retries: int = 2
    tools_dir: Path = Path("~/.cache/harnessrl/tools")
    network: Network = "host"
    sandbox: str = "local"  # local | docker
    # Show the agent an empty directory where the task's source (tests, solution), the
    # bundled tasks and other rollouts' sandboxes are (local sandbox; needs root).
    hide_host: bool = True
    image: str = "python:3.11-slim"  # docker sandbox only
    shaping: Shaping = field(default_factory=Shaping)


@dataclass
class Planned:
    harness: Harness
    task: Task
    sample: int

    @property
    def name(self) -> str:
        return f"{self.harness.name}.{self.task.id}.{self.sample}"


def plan(config: RunConfig, done: set[tuple[str, str, int]]) -> list[Planned]:
    """Every (harness, task, sample) without an outcome yet, harnesses interleaved."""
    return [Planned(h, t, i) for t, i, h in
            itertools.product(config.tasks, range(config.samples), config.harnesses)
            if (h.name, t.id, i) not in done]


class Runner:
    def __init__(self, config: RunConfig, store: TraceStore, proxy_url: str, run_dir: Path,
                 on_outcome: Callable[[Outcome], None] = lambda _o: None) -> None:
        self.config = config
        self.store = store
        self.proxy_url = proxy_url
        self.sandboxes = run_dir / "sandboxes"
        self.on_outcome = on_outcome

    def pending(self) -> list[Planned]:
        done = {(o.harness, o.task, o.sample) for o in self.store.outcomes()
                if o.status == "done"}
        return plan(self.config, done)

    async def run(self, todo: Sequence[Planned]) -> list[Outcome]:
        for harness in {p.harness.name: p.harness for p in todo}.values():
            await asyncio.to_thread(harness.install, self.config.tools_dir, lambda _l: None)
        gate = asyncio.Semaphore(self.config.concurrency)

        async def one(planned: Planned) -> Outcome:
            async with gate:
                outcome = await self._with_retries(planned)
            await self.store.put_outcome(outcome)
            self.on_outcome(outcome)
            return outcome

        return list(await asyncio.gather(*(one(p) for p in todo)))

    async def _with_retries(self, planned: Planned) -> Outcome:
        error, key = "", ""
        for attempt in range(1, self.config.retries + 2):
            try:
                key = await self._open_rollout(planned, attempt)
                return await self._attempt(planned, key, attempt)
            except (InfraError, SandboxError, TaskError, HarnessRLError, OSError,
                    httpx.HTTPError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            finally:
                if key:
                    await self._close_rollout(key)
        return Outcome(harness=planned.harness.name, harness_version=planned.harness.version,
                       task=planned.task.id, sample=planned.sample, rollout=key,
                       status="infra_error", attempts=self.config.retries + 1, error=error)

    async def _open_rollout(self, planned: Planned, attempt: int) -> str:
        metadata = {"harness": planned.harness.name, "harness_version": planned.harness.version,
                    "task": planned.task.id, "sample": planned.sample, "attempt": attempt}
        async with httpx.AsyncClient() as client:
            resp = await client.post(f"{self.proxy_url}/rollouts", json={"metadata": metadata})
            resp.raise_for_status()
            return resp.json()["key"]

    async def _close_rollout(self, key: str) -> None:
        async with httpx.AsyncClient() as client:
            await client.delete(f"{self.proxy_url}/rollouts/{key}",
                                headers={"Authorization": f"Bearer {key}"})

    async def _attempt(self, planned: Planned, key: str, attempt: int) -> Outcome:
        task, harness = planned.task, planned.harness
        deadline = time.monotonic() + task.agent_timeout + task.verifier_timeout + DEADLINE_SLACK
        timings: dict[str, float] = {}
        started = time.monotonic()
        sandbox = await self._sandbox(f"{planned.name}.{attempt}.{key[-8:]}", task)
        try:
            await prepare(task, sandbox)
            timings["sandbox"] = time.monotonic() - started
            ctx = RunContext(home=sandbox.home, workdir=sandbox.workdir,
                             proxy_root=f"{self.proxy_url}/r/{key}", key=key,
                             tools_dir=self.config.tools_dir)
            harness.setup(ctx)
            agent_started = time.monotonic()
            run = await sandbox.run(harness.command(ctx, task.instruction),
                                    env=harness.environment(ctx),
                                    timeout=min(task.agent_timeout, deadline - time.monotonic()))
            timings["agent"] = time.monotonic() - agent_started
            exit_state = harness.outcome(ctx, run.exit_code, run.stdout)
            verdict = await verify(task, sandbox)
            timings["verifier"] = verdict.seconds
        finally:
            await sandbox.close()
        timings["total"] = time.monotonic() - started
        if verdict.status in ("no_reward", "bad_reward", "not_run"):
            raise InfraError(f"the verifier gave no score ({verdict.status}: {verdict.reason})")
        engine_failures = [t.error for t in self.store.turns(key)
                           if t.error and t.error.split(":")[0] in _ENGINE_FAILURES]
        if engine_failures:
            raise InfraError(f"the engine failed during the run: {engine_failures[0]}")
        return self._scored(planned, key, attempt, verdict, exit_state.finished and
                            not run.timed_out, run, exit_state.detail, timings)

    async def _sandbox(self, name: str, task: Task) -> LocalSandbox:
        if self.config.sandbox == "docker":
            return await DockerSandbox.start(self.sandboxes, name, image=self.config.image,
                                             read_only=[self.config.tools_dir.expanduser()],
                                             network="host")
        hide = [self.sandboxes, BUNDLED, *([task.source] if task.source else [])]
        return await LocalSandbox.create(self.sandboxes, name, network=self.config.network,
                                         proxy_ports=[int(self.proxy_url.rsplit(":", 1)[1])],
                                         hide=hide if self.config.hide_host else (),
                                         show=[self.config.tools_dir.expanduser()])

    def _scored(self, planned: Planned, key: str, attempt: int, verdict: Verdict,
                finished: bool, run: ExecResult, detail: str,
                timings: dict[str, float]) -> Outcome:
        stats = TraceStats.of(self.store.turns(key))
        reward, terms = self.config.shaping.reward(verdict, stats)
        return Outcome(
            harness=planned.harness.name, harness_version=planned.harness.version,
            task=planned.task.id, sample=planned.sample, rollout=key, status="done",
            reward=reward, verifier_reward=verdict.reward, shaping=terms,
            agent_finished=finished, agent_timed_out=run.timed_out,
            agent_exit_code=run.exit_code, agent_detail=detail,
            verifier_status=verdict.status, verifier_output=verdict.output[-4000:],
            sandbox=self.config.sandbox, timings=timings, turns=stats.turns,
            tool_calls=stats.tool_calls, completion_tokens=stats.completion_tokens,
            attempts=attempt)
