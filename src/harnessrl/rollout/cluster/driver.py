"""Rollouts across a Ray cluster (`--cluster ray`, `[cluster]` in the train config).

The driver (this module, where `harnessrl run/eval/train` runs) connects to Ray
(`ray.init(address=...)`, or a local Ray when no address is given) and places one
`RolloutNode` actor on every alive node with a hard node-affinity strategy. Each actor
hosts a capture-proxy shard with its own durable store on its node and reserves, as Ray
resources, the node's CPU and memory for its rollout slots (and one `harness_slots` custom
resource per slot when the node offers it: `ray start --resources '{"harness_slots": 8}'`).

The driver hands out rollouts, at most `slots` in flight per node, and writes each
*finished* rollout the node returns (rollout record, turns with their exact ids, outcome
last) into the run's store, the one source of truth for training, export, the viewer and
resume. A node that dies (its actor or raylet) loses only its unfinished rollouts: their
calls fail with Ray's actor/node errors, nothing of them was written, and they go back
to the queue to run on another node, as infrastructure retries (counted in the
outcome's `attempts`, each named in the rollout's `lost_attempts` metadata).

Ray is imported only here and only when a cluster is asked for (extra `harnessrl[ray]`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec

from harnessrl.rollout.cluster.node import (
    EngineFactory,
    NodeResult,
    RolloutNode,
    decode_result,
    reach,
)
from harnessrl.rollout.runner import Planned, RunSettings, plan
from harnessrl.settings import flag
from harnessrl.store.writer import TraceStore
from harnessrl.types import Outcome, Sampling

SLOT_RESOURCE = "harness_slots"


class ClusterSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where and how rollouts run on Ray: `[cluster]` in the train config, `--cluster ray`
    and its flags for `run`/`eval`."""

    backend: str = "ray"  # the only one
    # "auto", "ray://host:10001", "host:6379"; None: local Ray
    address: Annotated[str | None, flag(
        "--cluster ray: the cluster to join (e.g. host:6379, auto); default: a local Ray",
        "--ray-address")] = None
    # Rollouts at once per node: the node's `harness_slots` resource when it has one,
    # else this (default: the rollout settings' concurrency), capped by its CPU and memory.
    slots_per_node: Annotated[int | None, flag(
        "--cluster ray: rollouts at once per node (default: the node's harness_slots "
        "resource, else --concurrency)")] = None
    cpus_per_rollout: float = 0.25  # Ray CPUs each rollout slot reserves on its node
    memory_per_rollout_mb: float = 0.0  # 0: not reserved
    # Reruns of a rollout after the node it ran on died (not counted against `retries`).
    node_losses: int = 3
    # Where each node keeps its shard's store: this directory on the node (default: the
    # run directory's `shards/<node id>`, the same path on every node).
    shard_root: str | None = None


def connect(settings: ClusterSettings) -> Any:
    """`ray.init` once: to the cluster at `settings.address`, or a local one."""
    try:
        import ray
    except ImportError as exc:  # the extra is missing
        raise RuntimeError("--cluster ray needs Ray: pip install 'harnessrl[ray]'") from exc
    if ray.is_initialized():
        return ray
    if settings.address is None:  # a Ray of our own on this machine, on its loopback
        ray.init(log_to_driver=False, include_dashboard=False, _node_ip_address="127.0.0.1")
    else:
        ray.init(address=settings.address, log_to_driver=False)
    return ray


def alive_nodes(ray: Any) -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]


def slots_for(node: dict[str, Any], settings: ClusterSettings, default: int) -> int:
    """How many rollouts the node can run at once, from its Ray resources."""
    resources = node.get("Resources", {})
    slots = int(resources.get(SLOT_RESOURCE, settings.slots_per_node or default))
    if settings.cpus_per_rollout > 0:
        slots = min(slots, math.floor(resources.get("CPU", 0) / settings.cpus_per_rollout))
    if settings.memory_per_rollout_mb > 0:
        memory_mb = resources.get("memory", 0) / 2**20
        slots = min(slots, math.floor(memory_mb / settings.memory_per_rollout_mb))
    return max(slots, 0)


@dataclass
class Node:
    """The driver's handle on one rollout node."""

    id: str
    actor: Any
    slots: int
    alive: bool = True
    running: int = 0
    finished: int = 0
    lost: int = 0

    @property
    def short(self) -> str:
        return self.id[:8]


@dataclass
class _Item:
    planned: Planned
    lost: list[str] = field(default_factory=list)


class ClusterRunner:
    """The runner's interface (`pending`, `run`) over the nodes of a Ray cluster, writing
    into `store` (the run's). `close` (or the `with`) kills the actors."""

    def __init__(self, config: RunSettings, store: TraceStore, run_dir: Path,
                 engine_factory: EngineFactory, cluster: ClusterSettings, *,
                 sampling: Sampling | None = None,
                 on_outcome: Callable[[Outcome], None] = lambda _o: None,
                 on_node: Callable[[Node], None] = lambda _n: None) -> None:
        self.config = config
        self.store = store
        self.run_dir = run_dir.resolve()
        self.cluster = cluster
        self.on_outcome = on_outcome
        self.on_node = on_node
        self.ray = connect(cluster)
        self._factory = engine_factory
        self._sampling = sampling
        self.nodes: list[Node] = []

    def start(self) -> list[Node]:
        """Places the rollout nodes (once; `run` does it when it has work) and waits until
        every shard serves."""
        if not self.nodes:
            self.nodes = self._place(self._factory, self._sampling)
        return self.nodes

    def __enter__(self) -> ClusterRunner:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _place(self, engine_factory: EngineFactory, sampling: Sampling | None) -> list[Node]:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor_class = self.ray.remote(RolloutNode)
        nodes = []
        for info in self._reaching(alive_nodes(self.ray), engine_factory):
            slots = slots_for(info, self.cluster, self.config.settings.concurrency)
            node_id = info["NodeID"]
            resources = ({SLOT_RESOURCE: float(slots)}
                         if SLOT_RESOURCE in info.get("Resources", {}) else {})
            memory = int(self.cluster.memory_per_rollout_mb * 2**20 * slots)
            actor = actor_class.options(
                num_cpus=self.cluster.cpus_per_rollout * slots, memory=memory or None,
                resources=resources, max_concurrency=slots + 4, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(node_id, str(self._shard_dir(node_id)), engine_factory, self.config,
                     sampling)
            nodes.append(Node(node_id, actor, slots))
        self.ray.get([n.actor.where.remote() for n in nodes])  # every shard is up
        return nodes

    def _reaching(self, infos: list[dict[str, Any]], engine_factory: EngineFactory
                  ) -> list[dict[str, Any]]:
        """The nodes with room for a rollout that reach at least one engine (asked on each
        node before anything is placed); none is an error giving each node's reasons."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        roomy = [i for i in infos
                 if slots_for(i, self.cluster, self.config.settings.concurrency) > 0]
        if not roomy:
            raise RuntimeError("no Ray node has room for a rollout (CPU, memory or "
                               f"{SLOT_RESOURCE}); see [cluster] settings")
        task = self.ray.remote(reach)
        answers = self.ray.get([task.options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
                i["NodeID"], soft=False)).remote(engine_factory) for i in roomy])
        keep = [i for i, a in zip(roomy, answers, strict=True)
                if any(why is None for why in a.values())]
        if keep:
            return keep
        reasons = "; ".join(f"node {i['NodeID'][:8]}: " + ", ".join(
            f"{u} {why}" for u, why in a.items()) for i, a in zip(roomy, answers, strict=True))
        raise RuntimeError(f"no Ray node can reach a policy engine ({reasons}); the engines' "
                           "URLs must be reachable from every rollout node (engine.urls "
                           "with an address the nodes can route to)")

    def _shard_dir(self, node_id: str) -> Path:
        root = Path(self.cluster.shard_root) if self.cluster.shard_root else (
            self.run_dir / "shards")
        return root / node_id[:16]

    def pending(self) -> list[Planned]:
        done = {(o.harness, o.task, o.sample) for o in self.store.outcomes()
                if o.status == "done"}
        return plan(self.config, done)

    async def run(self, todo: Sequence[Planned]) -> list[Outcome]:
        """Every planned rollout once, in the order given; each finished one is in the
        run's store when its outcome is reported."""
        if todo:
            await asyncio.to_thread(self.start)
        queue: asyncio.Queue[_Item | None] = asyncio.Queue()
        for planned in todo:
            queue.put_nowait(_Item(planned))
        results: dict[int, Outcome] = {}
        index = {id(p): n for n, p in enumerate(todo)}
        left = [len(todo)]

        def settle(item: _Item, outcome: Outcome) -> None:
            results[index[id(item.planned)]] = outcome
            self.on_outcome(outcome)
            left[0] -= 1
            if left[0] == 0:
                for _ in range(sum(n.slots for n in self.nodes)):
                    queue.put_nowait(None)

        # The least loaded node's workers wait first, so they take the first rollout: the
        # async trainer runs one rollout per call, many calls at once.
        by_load = sorted((n for n in self.nodes if n.alive),
                         key=lambda n: n.running / max(n.slots, 1))
        workers = [self._worker(node, queue, settle) for node in by_load
                   for _ in range(node.slots)]
        if todo:
            await asyncio.gather(*workers)
        else:
            for worker in workers:
                worker.close()
        while not queue.empty():  # every node died: what is left fails, saying why
            item = queue.get_nowait()
            if item is not None:
                settle(item, self._lost(item))
        return [results[n] for n in range(len(todo))]

    async def _worker(self, node: Node, queue: asyncio.Queue[_Item | None],
                      settle: Callable[[_Item, Outcome], None]) -> None:
        from ray.exceptions import NodeDiedError, ObjectLostError, RayActorError

        while node.alive and (item := await queue.get()) is not None:
            node.running += 1
            self.on_node(node)
            try:
                blob = await node.actor.run.remote(item.planned)
            except (RayActorError, NodeDiedError, ObjectLostError) as exc:
                node.alive = False
                node.running -= 1
                node.lost += 1
                self.on_node(node)
                item.lost.append(f"node {node.id} lost: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0]}")
                if len(item.lost) > self.cluster.node_losses:
                    settle(item, self._lost(item))
                else:
                    queue.put_nowait(item)
                break  # its other workers fail the same way; live nodes take the work
            node.running -= 1
            node.finished += 1
            settle(item, await self._commit(decode_result(blob), item))
            self.on_node(node)
        if not node.alive and not any(n.alive for n in self.nodes):
            queue.put_nowait(None)  # wake the run to fail what is left

    async def _commit(self, result: NodeResult, item: _Item) -> Outcome:
        """The finished rollout into the run's store: record, turns, outcome last (resume
        looks for the outcome, so a crash before it leaves the rollout to run again)."""
        outcome = msgspec.structs.replace(result.outcome,
                                          attempts=result.outcome.attempts + len(item.lost))
        if result.rollout is not None:
            metadata = {**result.rollout.metadata, "node": result.node}
            if item.lost:
                metadata["lost_attempts"] = item.lost
            await self.store.put_rollout(msgspec.structs.replace(result.rollout,
                                                                 metadata=metadata))
            await asyncio.gather(*(self.store.add_turn(t) for t in result.turns))
        await self.store.put_outcome(outcome)
        return outcome

    def _lost(self, item: _Item) -> Outcome:
        p = item.planned
        why = item.lost[-1] if item.lost else "no Ray node is left"
        return Outcome(harness=p.harness.name, harness_version=p.harness.version,
                       task=p.task.id, sample=p.sample, rollout="", status="infra_error",
                       attempts=len(item.lost), error=f"lost with its node: {why}")

    def announce(self, version: str | None) -> None:
        """Every live shard stamps `version` on its later turns."""
        self._each_live(lambda n: n.actor.set_weight_version.remote(version))

    def hold(self, timeout: float) -> None:
        """Every live shard holds its weight gate (new calls wait, running ones finish);
        returns once all of them have. A node lost meanwhile is left to the run, which
        reruns its rollouts elsewhere."""
        self._each_live(lambda n: n.actor.hold.remote(timeout))

    def release(self) -> None:
        """Every live shard opens its gate (the version its calls stamp from then on was
        announced before: `announce`)."""
        self._each_live(lambda n: n.actor.release.remote())

    def retire_server(self, url: str) -> None:
        """No shard routes to the vLLM at `url` any more (it failed a weight reload)."""
        self._each_live(lambda n: n.actor.retire_server.remote(url))

    def _each_live(self, call: Callable[[Node], Any]) -> None:
        from ray.exceptions import NodeDiedError, RayActorError

        live = [n for n in self.nodes if n.alive]
        refs = [call(n) for n in live]
        for node, ref in zip(live, refs, strict=True):
            try:
                self.ray.get(ref)
            except (RayActorError, NodeDiedError):
                node.alive = False  # its rollouts fail and go back to the queue

    def close(self) -> None:
        for node in self.nodes:
            if node.alive:
                with contextlib.suppress(Exception):
                    self.ray.get(node.actor.close.remote(), timeout=30)
            with contextlib.suppress(Exception):
                self.ray.kill(node.actor)
        self.nodes = []


class ShardedVersion:
    """A `Versioned` (train.weights) for the cluster: setting `weight_version` announces it
    to every shard, which `VLLMWeightSync` does only after vLLM confirms it serves it."""

    weight_version: str | None
    runner: ClusterRunner

    def __init__(self, runner: ClusterRunner) -> None:
        object.__setattr__(self, "runner", runner)
        object.__setattr__(self, "weight_version", None)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "weight_version":
            self.runner.announce(value)
        object.__setattr__(self, name, value)

    def retire_server(self, url: str) -> None:
        self.runner.retire_server(url)


@dataclass
class ClusterGate:
    """The weight gate of every shard of the cluster, held as the async trainer holds its
    own proxy's (`hold`, `release`): during a swap new calls wait on every node."""

    runner: ClusterRunner

    def hold(self, timeout: float) -> None:
        self.runner.hold(timeout)

    def release(self) -> None:
        self.runner.release()
