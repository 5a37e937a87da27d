"""The runner: harnesses on tasks in sandboxes, through the capture proxy, scored by the
task's verifier, with rewards we shape.

Each planned rollout is (harness, task, sample). It gets a rollout key, a fresh sandbox,
the task's files, one headless harness run, then the verifier (tests copied in only now),
and an `Outcome` stored beside its turns. One deadline covers sandbox start, agent and
verifier. Infrastructure failures (sandbox, install, engine, verifier without a score) are
retried and reported apart from agent failures, which are results. A run is resumable:
started again on the same run directory it skips every rollout that has an outcome.
Each runner, when made, sweeps the sandboxes dead runners left (rollout/sandbox/owners.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from harnessrl.errors import HarnessRLError
from harnessrl.harnesses.base import DEFAULT_TOOLS_DIR, ExitState, Harness, RunContext
from harnessrl.http.call import fetch
from harnessrl.http.client import TransportError
from harnessrl.rollout.rewards import Shaping, TraceStats
from harnessrl.rollout.sandbox import owners, registry
from harnessrl.rollout.sandbox.base import (
    BackendOptions,
    ExecResult,
    Network,
    Paused,
    Sandbox,
    SandboxError,
)
from harnessrl.rollout.tasks.task import Task, TaskError, Verdict, prepare, verify
from harnessrl.settings import at_least_one, flag
from harnessrl.store.writer import TraceStore
from harnessrl.types import Outcome, Sampling

# Turn errors that are the engine's fault, not the agent's (see errors.py kinds).
_ENGINE_FAILURES = frozenset({"engine_unavailable", "timeout", "engine_error"})
# Slack on top of the task's agent and verifier timeouts, for sandbox start and teardown.
DEADLINE_SLACK = 120.0


class InfraError(Exception):
    """Something outside the agent failed; the rollout is retried, never scored."""


class RolloutSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How every rollout runs, whoever starts it: `harnessrl run`/`eval`, the train
    config's `[rollout]` table (which extends this) and `HarnessRollouts`."""

    concurrency: Annotated[int, flag("rollouts at once")] = 2
    retries: Annotated[int, flag("retries of infrastructure failures")] = 2
    # harness prefixes, installed once, reused
    tools_dir: Annotated[str, flag("where harnesses are installed", parse=Path)] = str(
        DEFAULT_TOOLS_DIR)
    network: Annotated[Network, flag("local sandbox: loopback-proxy lets the agent reach "
                                     "only the proxy")] = "host"
    # the sandbox backend, local or docker (rollout/sandbox/registry.py has them); another
    # name is an error that lists them
    sandbox: Annotated[str, flag(choices=registry.names())] = "local"
    # Show the agent an empty directory where the task's source (tests, solution), the
    # bundled tasks and other rollouts' sandboxes are (local sandbox; needs root).
    hide_host: Annotated[bool, flag(
        "local sandbox: do not hide the tasks' tests and other rollouts' files from the "
        "agent, nor keep its writes inside its sandbox (both need root for a mount "
        "namespace)", "--no-hide", negate=True)] = True
    # Docker sandbox: an image for every task instead of the one built from its
    # environment/Dockerfile, and how many containers may be starting at once.
    image: Annotated[str | None, flag("docker sandbox: this image for every task (default: "
                                      "each task's own, built from its "
                                      "environment/Dockerfile)")] = None
    sandbox_starts: int = 2  # Docker sandbox: containers starting at once (daemon load)
    # Docker sandbox: the network `docker build` steps get. "host" (opt-in) lets a
    # Dockerfile install from the package registries this machine reaches; the agent's
    # container stays on `--network none` either way (see rollout/sandbox/docker_images.py).
    build_network: Annotated[Literal["none", "host"], flag(
        "docker sandbox: the network of `docker build` steps; host lets a Dockerfile install "
        "from the package registries this machine reaches (the agent's container stays on "
        "--network none)")] = "none"
    # Caps every task's own agent deadline (seconds): a small model that never finishes
    # keeps a harness busy until the deadline, and a training step waits for its slowest.
    agent_timeout: Annotated[float | None, flag("cap every task's own agent deadline",
                                                metavar="SECONDS")] = None
    # Each rollout's step cap in the proxy: the call after this many is refused in the
    # harness's dialect, and the rollout is scored as it stands, marked `capped`.
    max_model_calls: Annotated[Annotated[int, msgspec.Meta(ge=1)] | None, flag(
        "each rollout's step cap: the call after N is refused and the rollout is scored as "
        "it stands, marked capped", metavar="N", parse=at_least_one)] = None

    def __post_init__(self) -> None:
        registry.check(self.sandbox)

    @property
    def tools(self) -> Path:
        return Path(self.tools_dir).expanduser()


@dataclass(frozen=True)
class RunSettings:
    harnesses: Sequence[Harness]
    tasks: Sequence[Task]
    samples: Annotated[int, flag("rollouts per task and harness", "-k", "--samples")] = 1
    settings: RolloutSettings = field(default_factory=RolloutSettings)
    shaping: Shaping = field(default_factory=Shaping)


@dataclass
class Planned:
    harness: Harness
    task: Task
    sample: int

    @property
    def name(self) -> str:
        return f"{self.harness.slug}.{self.task.id}.{self.sample}"


class ControlError(Exception):
    """The proxy refused a control call (/rollouts): its status and what it said."""


async def control(method: str, url: str, body: Any = None, *,
                  headers: list[tuple[str, str]] | None = None) -> Any:
    """One call to the proxy's own routes (`http.call.fetch`, our one client): the answer's
    JSON, ControlError on a status other than 2xx, TransportError if the proxy cannot be
    reached."""
    reply = await fetch(method, url, body, headers=headers)
    if not reply.ok:
        raise ControlError(f"{method} {url}: HTTP {reply.status}: {reply.body[:300]!r}")
    return reply.json()


async def open_rollout(proxy_url: str, metadata: dict[str, Any], *,
                       max_model_calls: int | None = None,
                       sampling: Sampling | None = None) -> dict[str, Any]:
    """POST /rollouts: the new rollout's key and base URLs (ControlError or TransportError
    if not). `max_model_calls` None: the proxy's default cap; `sampling` None: the proxy's
    policy."""
    body: dict[str, Any] = {"metadata": metadata}
    if max_model_calls is not None:
        body["max_model_calls"] = max_model_calls
    if sampling is not None:
        body["sampling"] = msgspec.to_builtins(sampling)
    return await control("POST", f"{proxy_url}/rollouts", body)


def plan(config: RunSettings, done: set[tuple[str, str, int]]) -> list[Planned]:
    """Every (harness, task, sample) without an outcome yet, harnesses interleaved."""
    return [Planned(h, t, i) for t, i, h in
            itertools.product(config.tasks, range(config.samples), config.harnesses)
            if (h.name, t.id, i) not in done]


class Runner:
    def __init__(self, config: RunSettings, store: TraceStore, proxy_url: str, run_dir: Path,
                 on_outcome: Callable[[Outcome], None] = lambda _o: None, *,
                 metadata: Mapping[str, Any] | None = None,
                 sampling: Sampling | None = None, paused: Paused | None = None) -> None:
        """`metadata`: added to every rollout's (e.g. an eval pass's tag); `sampling`:
        every rollout's own policy instead of the proxy's; `paused`: the proxy's clock of
        the seconds it withheld the engine (its weight gate's), which agent timeouts do
        not count."""
        self.config = config
        self.paused = paused
        self.metadata = dict(metadata or {})
        self.sampling = sampling
        self.settings = config.settings
        self.store = store
        self.proxy_url = proxy_url
        self.sandboxes = run_dir / "sandboxes"
        self.backend = registry.backend(self.settings.sandbox, BackendOptions(
            tools=self.settings.tools, network=self.settings.network,
            hide_host=self.settings.hide_host, image=self.settings.image,
            starts=self.settings.sandbox_starts, build_network=self.settings.build_network,
            run_label=str(run_dir.resolve())))
        self.on_outcome = on_outcome
        # Every runner start (run, eval, train and its resumes, each Ray node's shard)
        # cleans what runners killed before they could close their sandboxes left.
        owners.sweep()

    def pending(self) -> list[Planned]:
        done = {(o.harness, o.task, o.sample) for o in self.store.outcomes()
                if o.status == "done"}
        return plan(self.config, done)

    async def run(self, todo: Sequence[Planned]) -> list[Outcome]:
        for harness in {p.harness.name: p.harness for p in todo}.values():
            await asyncio.to_thread(harness.install, self.settings.tools, lambda _l: None)
        gate = asyncio.Semaphore(self.settings.concurrency)

        async def one(planned: Planned) -> Outcome:
            async with gate:
                outcome = await self._with_retries(planned)
            await self.store.put_outcome(outcome)
            self.on_outcome(outcome)
            return outcome

        try:
            return list(await asyncio.gather(*(one(p) for p in todo)))
        finally:
            await self.backend.drain()  # nothing a sandbox of this run left outlives it

    async def _with_retries(self, planned: Planned) -> Outcome:
        error, key = "", ""
        for attempt in range(1, self.settings.retries + 2):
            try:
                key = await self._open_rollout(planned, attempt)
                return await self._attempt(planned, key, attempt)
            except (InfraError, SandboxError, TaskError, HarnessRLError, OSError,
                    ControlError, TransportError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            finally:
                if key:
                    await self._close_rollout(key)
        return Outcome(harness=planned.harness.name, harness_version=planned.harness.version,
                       task=planned.task.id, sample=planned.sample, rollout=key,
                       status="infra_error", attempts=self.settings.retries + 1, error=error)

    async def _open_rollout(self, planned: Planned, attempt: int) -> str:
        metadata = {**self.metadata, "harness": planned.harness.name,
                    "harness_version": planned.harness.version, "task": planned.task.id,
                    "sample": planned.sample, "attempt": attempt}
        return (await open_rollout(self.proxy_url, metadata,
                                   max_model_calls=self.settings.max_model_calls,
                                   sampling=self.sampling))["key"]

    async def _close_rollout(self, key: str) -> None:
        with contextlib.suppress(ControlError):  # closed already: nothing to close
            await control("DELETE", f"{self.proxy_url}/rollouts/{key}",
                          headers=[("Authorization", f"Bearer {key}")])

    async def _attempt(self, planned: Planned, key: str, attempt: int) -> Outcome:
        task, harness = planned.task, planned.harness
        if (cap := self.settings.agent_timeout) is not None:
            task = dataclasses.replace(task, agent_timeout=min(task.agent_timeout, cap))
        deadline = time.monotonic() + task.agent_timeout + task.verifier_timeout + DEADLINE_SLACK
        timings: dict[str, float] = {}
        started = time.monotonic()
        sandbox = await self._sandbox(f"{planned.name}.{attempt}.{key[-8:]}", task)
        try:
            await prepare(task, sandbox)
            timings["sandbox"] = time.monotonic() - started
            ctx = RunContext(home=sandbox.home, workdir=sandbox.workdir,
                             proxy_root=f"{self.proxy_url}/r/{key}", key=key,
                             tools_dir=self.settings.tools)
            harness.setup(ctx)
            agent_started = time.monotonic()
            run = await sandbox.run(harness.command(ctx, task.instruction),
                                    env=harness.environment(ctx),
                                    timeout=min(task.agent_timeout, deadline - time.monotonic()),
                                    paused=self.paused)
            timings["agent"] = time.monotonic() - agent_started
            if (run.timed_out or run.exit_code != 0) and self.store.next_index(key) == 0:
                # The model was never asked: the harness failed to start (a crash, a
                # prompt for a login, a missing runtime), which no policy can be blamed for.
                how = "timed out" if run.timed_out else f"exited {run.exit_code}"
                raise InfraError(f"{harness.name} {how} before its first model call: "
                                 f"{_tail(run)}")
            exit_state = harness.outcome(ctx, run.exit_code, run.stdout)
            verdict = await verify(task, sandbox)
            timings["verifier"] = verdict.seconds
        finally:
            await sandbox.close()
        timings["total"] = time.monotonic() - started
        if verdict.status in ("no_reward", "bad_reward", "not_run"):
            raise InfraError(f"the verifier gave no score ({verdict.status}: {verdict.reason})")
        engine_failures = [t.error for t in self.store.turns(key)
                           if t.error_kind in _ENGINE_FAILURES]
        if engine_failures:
            raise InfraError(f"the engine failed during the run: {engine_failures[0]}")
        return self._scored(planned, key, attempt, verdict, exit_state, run, timings)

    async def _sandbox(self, name: str, task: Task) -> Sandbox:
        return await self.backend.sandbox(self.sandboxes, name, task,
                                          [int(self.proxy_url.rsplit(":", 1)[1])])

    def _scored(self, planned: Planned, key: str, attempt: int, verdict: Verdict,
                exit_state: ExitState, run: ExecResult, timings: dict[str, float]) -> Outcome:
        turns = self.store.turns(key)
        stats = TraceStats.of(turns, executed=exit_state.actions)
        reward, terms = self.config.shaping.reward(verdict, stats)
        return Outcome(
            harness=planned.harness.name, harness_version=planned.harness.version,
            task=planned.task.id, sample=planned.sample, rollout=key, status="done",
            reward=reward, verifier_reward=verdict.reward, shaping=terms,
            agent_finished=exit_state.finished and not run.timed_out,
            agent_timed_out=run.timed_out, agent_exit_code=run.exit_code,
            agent_detail=exit_state.detail, agent_stderr=_tail(run),
            verifier_status=verdict.status, verifier_output=verdict.output[-4000:],
            sandbox=self.settings.sandbox, timings=timings, turns=stats.turns,
            tool_calls=stats.tool_calls, tool_call_source=stats.tool_call_source,
            completion_tokens=stats.completion_tokens,
            capped=any(t.error_kind == "step_cap" for t in turns), attempts=attempt)


def _tail(run: ExecResult, limit: int = 2000) -> str:
    """The end of what the harness wrote to stderr (where CLIs say why they stopped)."""
    return run.stderr[-limit:].decode(errors="replace").strip()
