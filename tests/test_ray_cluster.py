"""Rollouts on a real multi-node Ray cluster on this machine (`ray.cluster_utils.Cluster`:
a head and two worker nodes, each a real raylet with its own processes), bound to loopback.

Most rollouts use a cheap harness (`Chatty`: a real process in the sandbox that makes
two chat calls through the node's capture-proxy shard over HTTP, retrying a failed call
as harnesses do, then writes the file the verifier checks) and the scripted engine (named
as such; `Stoppable` is a scripted engine that is down once its stop file exists). One
test (marked `harness`) runs two real harness CLIs with the oracle engine.

One cluster for the module: Ray's start-up is the slow part. The test that kills a node
runs last.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest

# Ray would resolve 127.0.0.1 to this machine's outward address; with this it keeps every
# node, its GCS and the driver on loopback (read when Ray is imported).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402
from rich.console import Console  # noqa: E402

from harnessrl.errors import EngineUnavailable  # noqa: E402
from harnessrl.harnesses.base import Harness  # noqa: E402
from harnessrl.proxy.engines.scripted import ScriptedEngine, replay  # noqa: E402
from harnessrl.rollout.cluster.driver import ClusterRunner, ClusterSettings  # noqa: E402
from harnessrl.rollout.cluster.run import execute_on_cluster  # noqa: E402
from harnessrl.rollout.runner import RolloutSettings, RunSettings  # noqa: E402
from harnessrl.rollout.tasks.task import load_tasks  # noqa: E402
from harnessrl.store.reader import TraceReader  # noqa: E402
from harnessrl.store.writer import TraceStore  # noqa: E402

# Ray's start-up alone takes tens of seconds: the whole module is in the slow tier.
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"
QUIET = Console(file=open("/dev/null", "w"))  # noqa: SIM115

# Two chat calls through the proxy (a failed call is retried, as a harness's client
# does), a pause between them as an agent's tool call would take, then the answer file.
CHATTY = r"""
import json, sys, time, urllib.error, urllib.request
base, key, pause = sys.argv[1], sys.argv[2], float(sys.argv[3])
messages = [{"role": "user", "content": sys.argv[4]}]
for n in range(2):
    for attempt in range(10):
        body = json.dumps({"model": "policy", "messages": messages}).encode()
        request = urllib.request.Request(base + "/chat/completions", data=body, headers={
            "Authorization": "Bearer " + key, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                text = json.load(reply)["choices"][0]["message"]["content"] or ""
            break
        except urllib.error.HTTPError as error:
            print("retrying after", error.code, flush=True)
            time.sleep(0.5)
    else:
        sys.exit("the engine never answered")
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
    time.sleep(pause)
open("answer.txt", "w").write(text)
"""


class Chatty(Harness):
    """A cheap harness: this interpreter running CHATTY."""

    def executable(self, tools_dir: Path) -> Path:
        return Path(sys.executable)

    def install(self, tools_dir: Path, log=print) -> Path:
        return Path(sys.executable)


def chatty(pause: float = 0.2) -> Chatty:
    return Chatty(name="chatty", version="0", dialect="openai_chat", registry="pypi",
                  package="-", binary="python", streams=False,
                  argv=lambda ctx, instruction: ["-c", CHATTY, ctx.openai_base, ctx.key,
                                                 str(pause), instruction])


class Stoppable(ScriptedEngine):
    """The scripted engine, down (calls and health checks fail) once `stop` exists."""

    def __init__(self, tokenizer, model: str, stop: Path) -> None:
        super().__init__(tokenizer, replay(["ok"]), model=model)
        self.stop = stop

    def _down(self) -> None:
        if self.stop.exists():
            raise EngineUnavailable(f"{self.model} is stopped (test)")

    async def models(self) -> list[str]:
        self._down()
        return await super().models()

    async def _events(self, request, *, one_chunk):
        self._down()
        async for event in super()._events(request, one_chunk=one_chunk):
            yield event


def scripted(model: str = "scripted") -> ScriptedEngine:
    from harnessrl.rollout.conformance import policy_tokenizer

    return ScriptedEngine(policy_tokenizer(), replay(["ok"]), model=model)


def two_engines(stop_a: Path, stop_b: Path) -> list[Stoppable]:
    from harnessrl.rollout.conformance import policy_tokenizer

    tokenizer = policy_tokenizer()
    return [Stoppable(tokenizer, "engine-a", stop_a), Stoppable(tokenizer, "engine-b", stop_b)]


def tasks(tmp: Path, count: int):
    lines = [f'{{"id": "t{n}", "instruction": "answer {n}", "verify": ["test -s answer.txt"],'
             f' "timeout": 60}}' for n in range(count)]
    (tmp / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    return load_tasks(tmp / "tasks.jsonl")


SETTINGS = RolloutSettings(concurrency=2, retries=1, hide_host=False)
CLUSTER = ClusterSettings(cpus_per_rollout=0.25)


@pytest.fixture(scope="module")
def cluster():
    from harnessrl.rollout.conformance import policy_tokenizer

    policy_tokenizer()  # the tiny model is built once, before the nodes race to build it
    head = {"num_cpus": 1, "node_ip_address": LOOPBACK, "include_dashboard": False}
    made = Cluster(initialize_head=True, head_node_args=head)
    workers = [made.add_node(num_cpus=1, node_ip_address=LOOPBACK,
                             resources={"harness_slots": 2}) for _ in range(2)]
    made.wait_for_nodes()
    # The nodes' workers import this module (its harness and engines) from the checkout.
    ray.init(address=made.address, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        yield made, workers
    finally:
        ray.shutdown()
        made.shutdown()


def shard_turns(run_dir: Path) -> dict[str, list]:
    """Every rollout's turns as the shards recorded them, by rollout key."""
    found: dict[str, list] = {}
    for db in sorted((run_dir / "shards").glob("*/trace.db")):
        with TraceReader(db.parent) as shard:
            for rollout in shard.iter_rollouts():
                found[rollout.key] = shard.turns(rollout.key)
    return found


def test_every_planned_rollout_finishes_once_across_the_nodes(cluster, tmp_path):
    config = RunSettings(harnesses=[chatty()], tasks=tasks(tmp_path, 3), samples=2,
                       settings=SETTINGS)
    run_dir = tmp_path / "run"
    outcomes = execute_on_cluster(config, functools.partial(scripted), run_dir, CLUSTER,
                                  console=QUIET)
    assert len(outcomes) == 6 and all(o.status == "done" for o in outcomes), outcomes
    assert {(o.task, o.sample) for o in outcomes} == {(f"t{n}", s) for n in range(3)
                                                      for s in range(2)}
    assert all(o.verifier_reward == 1.0 and o.turns == 2 for o in outcomes)
    shards = shard_turns(run_dir)
    with TraceReader(run_dir) as store:
        rollouts = {r.key: r for r in store.iter_rollouts()}
        assert set(rollouts) == {o.rollout for o in outcomes}
        nodes = {r.metadata["node"] for r in rollouts.values()}
        for o in outcomes:
            turns = store.turns(o.rollout)
            # The run's store holds exactly what the node's shard recorded, ids and all.
            assert turns == shards[o.rollout] and len(turns) == 2
            assert all(t.completion and t.completion.tokens.completion_ids for t in turns)
        assert store.count_turns() == 12
    assert len(nodes) >= 2  # the work was spread over the cluster

    again = execute_on_cluster(config, functools.partial(scripted), run_dir, CLUSTER,
                               console=QUIET)  # resume: nothing is left to run
    with TraceReader(run_dir) as store:
        assert len(again) == 6 and store.count_turns() == 12


def test_a_stopped_engine_moves_its_rollouts_to_the_other(cluster, tmp_path):
    stop_a, stop_b = tmp_path / "stop-a", tmp_path / "stop-b"
    # More rollouts than slots (6): some start only after the engine is stopped.
    config = RunSettings(harnesses=[chatty(pause=0.5)], tasks=tasks(tmp_path, 4), samples=2,
                       settings=SETTINGS)
    run_dir = tmp_path / "run"
    stopped: dict[str, float] = {}

    with TraceStore(run_dir) as store, ClusterRunner(
            config, store, run_dir, functools.partial(two_engines, stop_a, stop_b),
            CLUSTER) as runner:
        def on_outcome(outcome):
            if stopped:
                return
            # Stop the engine that served the first finished rollout: it surely had work.
            model = store.turns(outcome.rollout)[0].model
            (stop_a if model == "engine-a" else stop_b).touch()
            stopped[model] = time.time()

        runner.on_outcome = on_outcome
        import asyncio

        outcomes = asyncio.run(runner.run(runner.pending()))
        turns = list(store.iter_turns())
    [(down, at)] = stopped.items()
    up = "engine-b" if down == "engine-a" else "engine-a"
    assert len(outcomes) == 8 and all(o.status == "done" for o in outcomes), outcomes
    served = [t for t in turns if t.status == "ok"]
    assert {t.model for t in served if t.timings.received < at} >= {down}
    # Once it is stopped only the other answers (a call sent to it fails, and routing
    # leaves it from then on, as does the next health check).
    late = [t for t in served if t.timings.received > at]
    assert late and {t.model for t in late} == {up}
    failed = [t for t in turns if t.status != "ok"]
    assert all(t.error_kind == "engine_unavailable" for t in failed)


@pytest.mark.harness
def test_two_real_harnesses_on_the_cluster(cluster, tmp_path):
    from harnessrl.harnesses import get
    from harnessrl.rollout.run import oracle_engine

    harnesses = [get("mini-swe-agent"), get("opencode")]
    bundled = load_tasks("bundled:create-hello-file")
    config = RunSettings(harnesses=harnesses, tasks=bundled,
                       settings=RolloutSettings(concurrency=2, retries=1))
    run_dir = tmp_path / "run"
    outcomes = execute_on_cluster(config, functools.partial(oracle_engine, bundled, harnesses),
                                  run_dir, CLUSTER, console=QUIET)
    assert len(outcomes) == 2 and all(o.status == "done" for o in outcomes), outcomes
    assert all(o.verifier_reward == 1.0 for o in outcomes)
    shards = shard_turns(run_dir)
    with TraceReader(run_dir) as store:
        for o in outcomes:
            assert store.turns(o.rollout) == shards[o.rollout] and o.turns >= 2


def test_a_killed_node_loses_only_unfinished_rollouts(cluster, tmp_path):
    made, workers = cluster
    victim = workers[0]
    config = RunSettings(harnesses=[chatty(pause=1.5)], tasks=tasks(tmp_path, 4), samples=2,
                       settings=SETTINGS)
    run_dir = tmp_path / "run"
    killed = threading.Event()
    started: list[threading.Thread] = []

    with TraceStore(run_dir) as store, ClusterRunner(
            config, store, run_dir, functools.partial(scripted), CLUSTER) as runner:
        def kill_when_recording() -> None:
            """Kills the worker once its shard has recorded a turn of an open rollout."""
            shard = run_dir / "shards" / victim.node_id[:16] / "trace.db"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with contextlib.suppress(sqlite3.Error), contextlib.closing(
                        sqlite3.connect(shard)) as db:
                    if db.execute("SELECT COUNT(*) FROM turns JOIN rollouts ON key = rollout"
                                  " WHERE closed IS NULL").fetchone()[0]:
                        break
                time.sleep(0.05)
            made.remove_node(victim)
            killed.set()

        def on_node(node):
            if node.id == victim.node_id and node.running and not started:
                started.append(threading.Thread(target=kill_when_recording))
                started[0].start()

        runner.on_node = on_node
        import asyncio

        outcomes = asyncio.run(runner.run(runner.pending()))
    assert killed.is_set()
    assert len(outcomes) == 8 and all(o.status == "done" for o in outcomes), outcomes
    with TraceReader(run_dir) as store:
        rollouts = {r.key: r for r in store.iter_rollouts()}
        # Only the finished attempts are in the run's store: one rollout per plan entry.
        assert set(rollouts) == {o.rollout for o in outcomes}
        pairs = store.db.execute("SELECT rollout, idx FROM turns").fetchall()
        assert len(pairs) == len(set(pairs)) == 16
        rerun = [o for o in outcomes if o.attempts > 1]
        assert rerun and all(victim.node_id in rollouts[o.rollout].metadata["lost_attempts"][0]
                             for o in rerun)
        assert all(rollouts[o.rollout].metadata["node"] != victim.node_id for o in rerun)
    # The dead attempts' turns are on the dead node's shard, and nowhere in the run's store.
    dead = [k for k, turns in shard_turns(run_dir).items() if k not in rollouts and turns]
    assert dead
    with sqlite3.connect(run_dir / "trace.db") as db:
        assert not db.execute(f"SELECT COUNT(*) FROM turns WHERE rollout IN "
                              f"({','.join('?' * len(dead))})", dead).fetchone()[0]
