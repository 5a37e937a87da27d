"""TRL GRPO on real harness rollouts: a `rollout_func` for `trl.GRPOTrainer` (TRL 1.16).

The dataset's prompts are task ids. TRL calls `HarnessRollouts(prompts, trainer)` with
each prompt already repeated `num_generations` times, consecutively (one group per task).
Each entry becomes one rollout: a real harness runs on the task in a sandbox, its model
calls go through the capture proxy to the trainer's vLLM, the task's verifier scores it.
What TRL gets back, one entry per prompt entry:

- `prompt_ids`, `completion_ids`: one chain of the rollout (`samples.sample`): the first
  prompt, then every sampled completion and the tokens inserted between them, exactly as
  the engine saw and produced them, never re-tokenized.
- `env_mask`: 1 on sampled tokens, 0 on inserted ones (tool results, template tokens)
  and on replies masked by `grpo.rejected_turns` / `truncated_turns`; TRL multiplies it
  into the loss mask.
- `logprobs`: the engine's logprob on each sampled token and NaN on inserted ones. TRL
  reads these only where the loss mask is 1 (its importance-sampling ratio multiplies the
  difference by the mask and maps NaN to 0; its off-policy mask and its logged divergence
  drop NaN the same way), so no value is invented for a token nobody sampled.
- our fields, forwarded by TRL to every reward function: `reward` (verifier + shaping),
  `verifier_reward`, `shaping`, `harness`, `task`, `status`, `rollout`, `chains`,
  `weight_versions`.

**One sample per rollout.** A rollout can hold several chains (side calls such as titles,
or a history the harness rewrote). TRL takes one sequence per entry, so the *main* chain
is trained: the one with the most turns (then the most sampled tokens, then the
earliest), i.e. the agent's own conversation; the others are counted in the metrics.

**Failed rollouts.** An infrastructure failure (`Outcome.status == "infra_error"`) has no
reward: `harness_reward` returns None for it, which TRL 1.16 turns into NaN, leaves out
of its group's mean and standard deviation (`nanmean`/`nanstd`), and gives advantage 0.
So the other rollouts of its group are scored exactly as if it had not been planned.
Such a rollout, or a scored one with no trainable turn, still needs an entry: it is one
pad token with mask 0 and a NaN logprob, which no loss term reads.

**Harness mix.** Several harnesses can share a batch: with `mix="group"` (the default)
each group runs one harness, rotating across groups and calls, so a group's baseline
compares like with like; with `mix="generation"` the generations of one task alternate
harnesses, so the baseline is the task's mean over harnesses. Either way `harness` is
recorded per entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from transformers import TrainerCallback

from harnessrl.harnesses.base import Harness
from harnessrl.proxy.app import Proxy
from harnessrl.proxy.engines.base import Engine
from harnessrl.rollout.analysis.chains import ChainStats, link, rollout_stats
from harnessrl.rollout.rewards import Shaping
from harnessrl.rollout.runner import Planned, RolloutSettings, Runner, RunSettings
from harnessrl.rollout.serving import serving
from harnessrl.rollout.tasks.task import Task
from harnessrl.store.writer import TraceStore
from harnessrl.train.rows.grpo import RowSettings, flagged_turns, masked_chain
from harnessrl.train.rows.samples import main_chain, sample
from harnessrl.train.weights import Gate, Versioned, VLLMWeightSync, version_name
from harnessrl.types import Outcome, Sample, Sampling, Turn

if TYPE_CHECKING:  # Ray is imported only by a run on a cluster
    from harnessrl.rollout.cluster.driver import ClusterRunner, ClusterSettings, ShardedVersion
    from harnessrl.rollout.cluster.node import EngineFactory

Mix = Literal["group", "generation"]
NAN = float("nan")
GATE_TIMEOUT = 600.0  # seconds a reload waits for the calls in flight


@dataclass(frozen=True)
class RolloutRecord:
    """One rollout as trained: its outcome, the sample chosen from it (None: nothing to
    train on) and its chain statistics."""

    outcome: Outcome
    sample: Sample | None
    stats: ChainStats

    @property
    def solved(self) -> bool:
        return self.outcome.status == "done" and (self.outcome.verifier_reward or 0) >= 1


@dataclass
class Batch:
    """One call of the rollout function."""

    step: int
    records: list[RolloutRecord]
    seconds: float


# ------------------------------------------------------------------ one rollout -> one entry
def record_for(outcome: Outcome, turns: Sequence[Turn],
               rows: RowSettings | None = None, *, keep_retried: bool = False
               ) -> RolloutRecord:
    """The rollout's main chain as a sample, its rejected and truncated replies masked
    per `rows` (none: trained like the rest); none for an infrastructure failure, whose
    turns (if any) belong to an attempt that has no reward."""
    stats = rollout_stats(turns) if turns else ChainStats(rollouts=1)
    if outcome.status != "done" or not turns:
        return RolloutRecord(outcome, None, stats)
    chain = main_chain(link(turns, keep_retried=keep_retried).chains)
    if chain is None:
        return RolloutRecord(outcome, None, stats)
    if rows is None:
        return RolloutRecord(outcome, sample(chain), stats)
    return RolloutRecord(outcome, masked_chain(chain, flagged_turns(turns), rows), stats)


def columns(records: Sequence[RolloutRecord], pad_token_id: int) -> dict[str, list[Any]]:
    """The rollout function's answer: TRL's four keys plus our fields, one entry each."""
    out: dict[str, list[Any]] = {k: [] for k in (
        "prompt_ids", "completion_ids", "logprobs", "env_mask", "reward", "verifier_reward",
        "shaping", "harness", "task", "status", "rollout", "chains", "weight_versions")}
    for rec in records:
        s, o = rec.sample, rec.outcome
        if s is None:  # a placeholder no loss term reads (mask 0) and no baseline counts
            out["prompt_ids"].append([pad_token_id])
            out["completion_ids"].append([pad_token_id])
            out["logprobs"].append([NAN])
            out["env_mask"].append([0])
        else:
            out["prompt_ids"].append(list(s.prompt_ids))
            out["completion_ids"].append(list(s.completion_ids))
            out["logprobs"].append(s.dense_logprobs(NAN))
            out["env_mask"].append(list(s.mask))
        out["reward"].append(o.reward if o.status == "done" else None)
        out["verifier_reward"].append(o.verifier_reward)
        out["shaping"].append(dict(o.shaping))
        out["harness"].append(o.harness)
        out["task"].append(o.task)
        out["status"].append(o.status)
        out["rollout"].append(o.rollout)
        out["chains"].append(rec.stats.chains)
        out["weight_versions"].append(sorted({v for v in s.weight_versions if v is not None})
                                      if s is not None else [])
    return out


def on_policy_sampling(temperature: float = 1.0, max_tokens: int | None = None) -> Sampling:
    """Sampling for every call of a training rollout, overriding the harness: the
    trainer's temperature (set GRPOConfig.temperature to the same) and no top_p, top_k,
    min_p or penalties, so tokens come from the distribution the trainer differentiates.
    (vLLM's logprobs are raw, before temperature: at a temperature other than 1 start it
    with `--logprobs-mode processed_logprobs`.)"""
    return Sampling(max_tokens=max_tokens, temperature=temperature, top_p=1.0, top_k=0,
                    min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
                    frequency_penalty=0.0)


def harness_reward(prompts: list[Any], completions: list[Any], reward: list[float | None],
                   **_: Any) -> list[float | None]:
    """The reward function for GRPOTrainer: the rollout's reward (verifier + shaping), or
    None for an infrastructure failure, which TRL keeps out of the group baseline."""
    return [None if r is None else float(r) for r in reward]


# ------------------------------------------------------------------ the rollout function
@dataclass
class HarnessRollouts:
    """The `rollout_func`: harnesses on tasks through the capture proxy, against `engine`.

    Use as a context manager (it serves the proxy in a thread and owns the trace store in
    `run_dir`), pass it as `GRPOTrainer(rollout_func=...)` and `callback()` as a callback.
    """

    tasks: Sequence[Task]
    harnesses: Sequence[Harness]
    engine: Engine
    run_dir: Path
    pad_token_id: int
    sync: VLLMWeightSync | None = None
    sampling: Sampling | None = None
    shaping: Shaping = field(default_factory=Shaping)
    mix: Mix = "group"
    settings: RolloutSettings = field(default_factory=lambda: RolloutSettings(retries=1))
    train_retried: bool = False  # grpo.train_retried: turns a client retried are trained
    on_outcome: Callable[[Outcome], None] = lambda _o: None
    batches: list[Batch] = field(default_factory=list)
    # The rollouts run on a Ray cluster (`rollout.cluster.driver.ClusterSettings`), each node's
    # proxy shard with the engines `engine_factory` builds there; `engine` is then unused.
    cluster: ClusterSettings | None = None
    engine_factory: EngineFactory | None = None
    proxy_port: int | None = None  # None: any free port (`url` says which)
    # which harness the next `plan` call starts with (it moves one on per call)
    rotation: int = 0
    # how the sync trainer masks rejected and truncated replies (None: it does not)
    rows: RowSettings | None = None
    # told each batch with the trainer that asked for it (the sync trainer's per-harness
    # figures go into the trainer's metrics this way)
    on_batch: Callable[[Batch, Any], None] = lambda _batch, _trainer: None

    def __post_init__(self) -> None:
        if not self.harnesses:
            raise ValueError("HarnessRollouts needs at least one harness")
        self._tasks = {t.id: t for t in self.tasks}
        self._stack = contextlib.ExitStack()
        self._store: TraceStore | None = None
        self._proxy: Proxy | None = None
        self.url = ""  # the proxy's, once served
        self._runner: Runner | ClusterRunner | None = None
        self._samples: dict[tuple[str, str], int] = {}
        self._planning = threading.Lock()
        self._extra_tasks: dict[str, Task] = {}
        self._synced_step: int | None = None
        self._sharded: ShardedVersion | None = None

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> HarnessRollouts:
        if self.cluster is not None:
            return self._enter_cluster(self.cluster)
        if self.sync is not None and self.engine not in self.sync.engines:
            self.sync.engines.append(self.engine)  # every turn records the version
        served = self._stack.enter_context(serving(
            self._config(), self.engine, self.run_dir, port=self.proxy_port,
            sampling=self.sampling, on_outcome=lambda o: self.on_outcome(o)))
        self._store, self._proxy, self.url = served.store, served.proxy, served.url
        self._runner = served.runner
        self.resume_samples(served.store)
        return self

    def _enter_cluster(self, cluster: ClusterSettings) -> HarnessRollouts:
        from harnessrl.rollout.cluster.driver import ClusterRunner

        if self.engine_factory is None:
            raise ValueError("HarnessRollouts on a cluster needs an engine_factory")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._store = store = self._stack.enter_context(TraceStore(self.run_dir))
        self.resume_samples(store)
        runner = self._stack.enter_context(ClusterRunner(
            self._config(), store, self.run_dir, self.engine_factory, cluster,
            sampling=self.sampling, on_outcome=lambda o: self.on_outcome(o)))
        runner.start()
        self._runner = runner
        if self.sync is not None:  # every shard stamps the version once vLLM serves it
            self.sync.engines.append(self.versioned())
        return self

    def _config(self) -> RunSettings:
        return RunSettings(harnesses=self.harnesses, tasks=self.tasks, settings=self.settings,
                         shaping=self.shaping)

    def resume_samples(self, store: TraceStore) -> None:
        """Sample numbers go on above every stored outcome's (a resumed run's, too), so
        they stay unique per harness and task."""
        with self._planning:
            for o in store.outcomes():
                key = (o.harness, o.task)
                self._samples[key] = max(self._samples.get(key, 0), o.sample + 1)

    def __exit__(self, *_exc: object) -> None:
        self._stack.close()

    @property
    def store(self) -> TraceStore:
        if self._store is None:
            raise RuntimeError("use HarnessRollouts as a context manager (with ...:)")
        return self._store

    def gates(self) -> list[Gate]:
        """The weight gates to hold during a swap: this process's proxy's, or on a cluster
        every shard's (`ClusterGate`)."""
        if self.cluster is None:
            return [self.proxy.gate]
        from harnessrl.rollout.cluster.driver import ClusterGate

        return [ClusterGate(self._cluster_runner())]

    def versioned(self) -> Versioned:
        """What stamps the version on every later turn: the proxy's engine, or on a
        cluster every shard's engine (`ShardedVersion`), made once."""
        if self.cluster is None:
            return self.engine
        if self._sharded is None:
            from harnessrl.rollout.cluster.driver import ShardedVersion

            self._sharded = ShardedVersion(self._cluster_runner())
        return self._sharded

    def _cluster_runner(self) -> ClusterRunner:
        from harnessrl.rollout.cluster.driver import ClusterRunner

        if not isinstance(self._runner, ClusterRunner):
            raise RuntimeError("use HarnessRollouts as a context manager (with ...:)")
        return self._runner

    @property
    def proxy(self) -> Proxy:
        """The capture proxy being served (its weight gate is held during a swap)."""
        if self._proxy is None:
            raise RuntimeError("use HarnessRollouts as a context manager (with ...:)")
        return self._proxy

    # ---------------------------------------------------------------- TRL entry point
    def __call__(self, prompts: list[Any], trainer: Any = None) -> dict[str, list[Any]]:
        started = time.monotonic()
        step = 0 if trainer is None else int(trainer.state.global_step)
        if trainer is not None:
            self.ensure_synced(trainer.accelerator.unwrap_model(trainer.model), step,
                               moved_by_trl=bool(getattr(trainer, "use_vllm", False)))
        records = self.rollouts(self.plan([str(p) for p in prompts], _generations(trainer)))
        self.batches.append(Batch(step, records, time.monotonic() - started))
        self.on_batch(self.batches[-1], trainer)
        return columns(records, self.pad_token_id)

    def plan(self, task_ids: Sequence[str], generations: int) -> list[Planned]:
        unknown = sorted({t for t in task_ids if t not in self._tasks})
        if unknown:
            raise ValueError(f"prompts must be task ids; unknown: {unknown[:5]} (known: "
                             f"{sorted(self._tasks)[:10]} ...)")
        planned = []
        for position, task_id in enumerate(task_ids):
            slot = (position // generations + self.rotation if self.mix == "group"
                    else position % generations)
            planned.append(self.planned_for(self.harnesses[slot % len(self.harnesses)],
                                            task_id))
        # The next call starts one harness further, so a task drawn again meets another.
        self.rotation += 1
        return planned

    def planned_for(self, harness: Harness, task_id: str) -> Planned:
        """`harness` on the task, with the next sample number of that pair."""
        key = (harness.name, task_id)
        with self._planning:  # training and an eval pass plan from two threads
            number = self._samples.get(key, 0)
            self._samples[key] = number + 1
        return Planned(harness, self._tasks.get(task_id) or self._extra_tasks[task_id], number)

    def add_tasks(self, tasks: Sequence[Task]) -> None:
        """Tasks that `planned_for` may plan besides the training tasks (eval's)."""
        self._extra_tasks.update({t.id: t for t in tasks})

    def rollouts(self, planned: Sequence[Planned]) -> list[RolloutRecord]:
        """Run `planned` (in order) and read each one's sample back from the store."""
        if self._runner is None:
            raise RuntimeError("use HarnessRollouts as a context manager (with ...:)")
        outcomes = asyncio.run(self.run_planned(planned))
        return [record_for(o, self.seen_turns(o.rollout), self.rows,
                           keep_retried=self.train_retried) for o in outcomes]

    async def run_planned(self, planned: Sequence[Planned]) -> list[Outcome]:
        """Run `planned` on the caller's event loop; outcomes in order, each stored."""
        if self._runner is None:
            raise RuntimeError("use HarnessRollouts as a context manager (with ...:)")
        return await self._runner.run(planned)

    def seen_turns(self, key: str) -> list[Turn]:
        """The rollout's turns whose reply was done before the rollout closed: a harness
        killed at its deadline never saw a reply that finished later, so that reply is no
        part of its trajectory (and whether it is stored yet would be a race)."""
        record = self.store.rollout(key) if key else None
        if record is None:
            return []
        closed = record.closed if record.closed is not None else float("inf")
        return [t for t in self.store.turns(key)
                if t.timings.done is not None and t.timings.done <= closed]

    # ---------------------------------------------------------------- weights
    def ensure_synced(self, model: Any, step: int, *, moved_by_trl: bool = False) -> None:
        """vLLM serves `model`'s weights, named after the global step `step`.

        With TRL's own vLLM sync (`use_vllm`, NCCL on GPUs) TRL has just moved the weights
        before calling us (`moved_by_trl`), so only the name is set; else they go by file."""
        if self.sync is None or self._synced_step == step:
            return
        if moved_by_trl:
            self.sync.announce(version_name(step))
        else:
            with self._gates_held():
                self.sync.push(model, version_name(step))
        self._synced_step = step

    @property
    def synced_step(self) -> int:
        """The step whose weights vLLM serves by our sync (0 before the first)."""
        return self._synced_step or 0

    @contextlib.contextmanager
    def _gates_held(self) -> Iterator[None]:
        """The proxy's gates held during a reload, once served: calls running beside the
        sync trainer's steps (an eval pass's) finish on the old weights and new ones wait
        for the new, so no turn spans a reload or records a version it was not sampled
        with. Between steps nothing else is in flight, so holding is immediate."""
        gates = self.gates() if self._runner is not None else []
        held: list[Gate] = []
        try:
            for gate in gates:
                gate.hold(GATE_TIMEOUT)
                held.append(gate)
            yield
        finally:
            for gate in held:
                gate.release()

    def callback(self) -> TrainerCallback:
        return WeightSyncCallback(self)


class WeightSyncCallback(TrainerCallback):
    """Pushes the weights to vLLM right after every optimizer step, so vLLM never serves
    stale weights between steps (or after the last one). With TRL's own vLLM sync
    (`use_vllm=True`) TRL moves them lazily before the next generation, and the rollout
    function names the version then."""

    def __init__(self, rollouts: HarnessRollouts) -> None:
        self.rollouts = rollouts

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None,
                    **_: Any) -> None:
        if model is None or getattr(args, "use_vllm", False):
            return
        self.rollouts.ensure_synced(getattr(model, "module", model), int(state.global_step))


def _generations(trainer: Any) -> int:
    if trainer is None:
        return 1
    training = getattr(getattr(trainer, "model", None), "training", True)
    value = trainer.num_generations if training else getattr(
        trainer, "num_generations_eval", trainer.num_generations)
    return int(value or 1)
