"""The asynchronous trainer at cluster scale (issue 38), on real parts: TRL's
`AsyncGRPOTrainer` with harnessrl's rollout worker, two real vLLM servers (dev mode) serving
the tiny model, and for the cluster test a real multi-node Ray cluster on this machine
(`ray.cluster_utils.Cluster`: a head and two worker raylets, on loopback). The agents are
real processes talking to the capture proxy through the `openai` SDK (scripted agents:
their loop is a short script; the model is real).

- A transfer that is not ours (`ForeignTransfer`: it moves the weights its own way and,
  like TRL's NCCL transfer, names no version) still gets every row tagged and trained.
- Async GRPO with `[cluster]`: rows from every node trained; each turn's version is the
  one every server in routing served when it was admitted; stale rows dropped and counted;
  a node killed mid-run loses only its unfinished rollouts, rerun elsewhere, and none of
  the dead attempts' turns is trained; the two servers reload at once; a server made to
  fail its reload (stopped) is taken out and the run goes on with the other.

Two vLLM servers on 2 cores are heavy: the tiny model, a short context, started once for
the module; the cluster test runs last (it stops one of them).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from tests.helpers import CACHE
from tests.test_async_grpo import AGENT, EVERY_ROW, agent

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"


@pytest.fixture(scope="module")
def two_vllm(tiny_model: Path):
    """Two vLLM servers for the tiny model, started at once, with a short context."""
    from harnessrl.proxy.engines.build import EngineSettings
    from harnessrl.train.engines import start_servers

    spec = EngineSettings(kind="chat", model=str(tiny_model), tokenizer=str(tiny_model),
                      served_name="policy", dtype="float32", max_model_len=1024,
                      vllm_args=["--seed", "0"], vllm_log=CACHE / "vllm-async-cluster.log")
    servers: list[Any] = []

    def keep(one_spec: EngineSettings) -> Any:
        from harnessrl.proxy.engines.build import server_for

        servers.append(server_for(one_spec))
        return servers[-1]

    with contextlib.ExitStack() as stack:
        urls = start_servers(spec, 2, stack, keep)
        yield spec, urls, servers


def _tasks(tmp_path: Path) -> list[Any]:
    from harnessrl.rollout.tasks.task import load_tasks

    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("\n".join(json.dumps(t) for t in [
        {"id": "finish", "instruction": "Finish the job", "verify": ["test -f done.txt"]},
        {"id": "report", "instruction": "Report back", "verify": ["test -f done.txt"]}]))
    return load_tasks(tasks_file)


def _trainer(model: Path, url: str, out: Path, worker: Any, transfer: Any, steps: int,
             tasks: list[Any]) -> Any:
    from datasets import Dataset

    from harnessrl.train.async_grpo.batches import group_trainer
    from harnessrl.train.async_grpo.transfer import install_cpu_support
    from harnessrl.train.trl_compat import async_trl

    trl = async_trl()
    install_cpu_support()
    args = trl.config(
        output_dir=str(out), max_steps=steps, per_device_train_batch_size=4,
        num_generations=2, learning_rate=5e-2, use_cpu=True, bf16=False, dtype="float32",
        report_to="none", logging_steps=1, save_strategy="no", token_budget=0,
        max_staleness=0, vllm_server_base_url=url, seed=0, disable_tqdm=True)
    trainer = group_trainer(trl.trainer, groups_per_step=2, scale="group")
    return trainer(model=str(model), args=args, rollout_worker=worker,
                   weight_transfer=transfer,
                   train_dataset=Dataset.from_dict({"prompt": [t.id for t in tasks]}))


def _consumed(worker: Any) -> list[Any]:
    """What the trainer takes from the worker's queue, as it takes it."""
    consumed: list[Any] = []
    get = worker.rollout_buffer.get
    def take(*a: Any, **k: Any) -> Any:  # a whole group; its rows are what is consumed
        item = get(*a, **k)
        consumed.extend(item.samples)
        return item

    worker.rollout_buffer.get = take
    return consumed


# ------------------------------------------------------------------ a transfer not ours
class ForeignTransfer:
    """TRL's `WeightTransferProtocol` as another library would implement it: pauses vLLM
    itself (`/pause`, `/resume`), writes the weights with its own code to its own
    directory and has every server load them, and names no version (as TRL's NCCL
    transfer, whose `finish_weight_update` carries none)."""

    def __init__(self, urls: list[str], model_dir: Path, out: Path) -> None:
        self.urls, self.model_dir, self.out = urls, model_dir, out
        self.served_after_send: list[list[str | None]] = []

    def _post(self, url: str, path: str, body: Any = None) -> None:
        import httpx

        reply = httpx.post(f"{url}{path}", json=body, timeout=300)
        assert reply.status_code == 200, reply.text

    def init_weight_transfer(self) -> None:
        from transformers import AutoConfig

        self.config = AutoConfig.from_pretrained(self.model_dir)

    def pause(self) -> None:
        for url in self.urls:
            self._post(url, "/pause?mode=wait")

    def send_weights(self, iterator: Any) -> None:
        import httpx
        from safetensors.torch import save_file

        self.out.mkdir(parents=True, exist_ok=True)
        save_file({n: t.detach().contiguous() for n, t in iterator},
                  str(self.out / "model.safetensors"))
        self.config.save_pretrained(self.out)
        for url in self.urls:
            self._post(url, "/collective_rpc", {"method": "reload_weights",
                                                "kwargs": {"weights_path": str(self.out)}})
            self._post(url, "/reset_prefix_cache")
        # what each server reports right after this transfer moved the weights
        self.served_after_send.append([httpx.get(f"{u}/weight_info").json()["weight_version"]
                                       for u in self.urls])

    def resume(self) -> None:
        for url in self.urls:
            self._post(url, "/resume")

    def destroy(self) -> None:
        pass


def test_a_transfer_that_names_no_version_still_gets_its_rows_tagged_and_trained(
        two_vllm, tiny_model, tmp_path):
    from harnessrl.proxy.engines.build import make
    from harnessrl.proxy.engines.routed import routed
    from harnessrl.rollout.runner import RolloutSettings
    from harnessrl.train.async_grpo.transfer import VersionedTransfer, version_number
    from harnessrl.train.async_grpo.worker import HarnessRolloutWorker
    from harnessrl.train.trl import HarnessRollouts, on_policy_sampling
    from harnessrl.train.weights import VLLMWeightSync

    spec, urls, _servers = two_vllm
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    tasks = _tasks(tmp_path)
    import msgspec

    engine = routed([make(msgspec.structs.replace(spec, url=u)) for u in urls])
    sync = VLLMWeightSync(urls[0], tmp_path / "unused", more_urls=urls[1:])
    foreign = ForeignTransfer(urls, tiny_model, tmp_path / "foreign")
    transfer = VersionedTransfer(foreign, sync)
    rollouts = HarnessRollouts(
        tasks=tasks, harnesses=[agent("chat", script)], engine=engine,
        run_dir=tmp_path / "run", pad_token_id=0, sampling=on_policy_sampling(max_tokens=8),
        settings=RolloutSettings(retries=0, hide_host=False))
    worker = HarnessRolloutWorker(rollouts, num_generations=2, max_inflight=4,
                                  max_staleness=1, transfer=transfer,
                                  **EVERY_ROW)
    trainer = _trainer(tiny_model, urls[0], tmp_path / "out", worker, transfer, 2, tasks)
    consumed = _consumed(worker)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    initial = sync.agreed_version()
    trainer.train()
    rows = [row for report in worker.reports for row in report.rows]
    print("\nforeign transfer:", {"stats": dict(worker.stats),
                                  "after_send": foreign.served_after_send})
    # the transfer moved the weights and named none: right after each move every server
    # still reported the name it had before (vLLM's initial one, then ours), so alone
    # its rows would be untagged (the claim in issue 38) ...
    assert version_number(initial) is None
    assert foreign.served_after_send == [[initial] * 2, ["v1"] * 2, ["v2"] * 2]
    # ... and wrapped, every server names each swap, and the turns carry those names
    assert sync.agreed_version() == "v3" and transfer.version == 3
    assert rows and all(r.version is not None and r.fate != "untagged" for r in rows)
    assert worker.stats["rows_untagged"] == 0
    queued = {r.input_ids for r in rows if r.fate == "queued"}
    assert consumed and all(tuple(s.input_ids.tolist()) in queued for s in consumed)
    trained = dict(trainer.model.named_parameters())
    moved = any(not p.detach().equal(before[n]) for n, p in trained.items())
    # The agent's reward is a coin flip (its reply's length): when every group the trainer
    # took scored alike, no row has an advantage and no step has a gradient to move the
    # weights with (CI saw that once). The weights moved exactly when a step had one.
    grads = [log["grad_norm"] for log in trainer.state.log_history if "grad_norm" in log]
    assert len(grads) == 2 and moved == any(g > 0 for g in grads), grads


# ------------------------------------------------------------------ async on a cluster
@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from harnessrl.rollout.conformance import policy_tokenizer

    policy_tokenizer()
    # the head runs no rollout (no CPU for a node actor); each worker raylet runs two
    head = {"num_cpus": 0, "node_ip_address": LOOPBACK, "include_dashboard": False}
    made = Cluster(initialize_head=True, head_node_args=head)
    workers = [made.add_node(num_cpus=1, node_ip_address=LOOPBACK,
                             resources={"harness_slots": 2}) for _ in range(2)]
    made.wait_for_nodes()
    ray.init(address=made.address, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}})
    try:
        yield made, workers
    finally:
        ray.shutdown()
        made.shutdown()


def test_a_cluster_no_node_of_which_reaches_an_engine_is_refused(ray_cluster, tmp_path):
    from harnessrl.proxy.engines.build import EngineSettings
    from harnessrl.proxy.engines.vllm_server import free_port
    from harnessrl.rollout.cluster.driver import ClusterRunner, ClusterSettings
    from harnessrl.rollout.cluster.run import engines_from
    from harnessrl.rollout.runner import RunSettings
    from harnessrl.store.writer import TraceStore

    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    factory = functools.partial(engines_from, [EngineSettings(kind="chat", url=nowhere)])
    config = RunSettings(harnesses=[], tasks=[])
    with TraceStore(tmp_path) as store, ClusterRunner(
            config, store, tmp_path, factory, ClusterSettings()) as runner, \
            pytest.raises(RuntimeError, match="no Ray node can reach a policy engine") as err:
        runner.start()
    assert nowhere in str(err.value) and "Connection refused" in str(err.value)


class _Swaps:
    """Stamps each swap of `transfer`: when the gates were held, when released, and the
    version then served; before swap `fail_at` sends, `stop` is called."""

    def __init__(self, transfer: Any, fail_at: int, stop: Any) -> None:
        self.held: dict[int, float] = {}  # version -> when the swap to it began
        self.drained: dict[int, float] = {}  # ... and when every gate was held
        pause, send = transfer.pause, transfer.send_weights

        def paused() -> None:
            self.held[transfer.version + 1] = time.time()
            pause()
            self.drained[transfer.version + 1] = time.time()

        def sending(iterator: Any) -> None:
            if transfer.version + 1 == fail_at:
                stop()
            send(iterator)

        transfer.pause, transfer.send_weights = paused, sending


def _node_of(run_dir: Path, key: str) -> str | None:
    """The node that ran rollout `key`, from the run's store (read from another thread)."""
    from harnessrl.store.reader import TraceReader

    with TraceReader(run_dir) as store:
        record = store.rollout(key)
    return None if record is None else record.metadata.get("node")


def test_async_grpo_on_a_ray_cluster_with_two_vllm_servers(ray_cluster, two_vllm, tiny_model,
                                                           tmp_path):
    from harnessrl.rollout.cluster.driver import ClusterSettings
    from harnessrl.rollout.cluster.run import engines_from
    from harnessrl.rollout.runner import RolloutSettings
    from harnessrl.store.reader import TraceReader
    from harnessrl.train.async_grpo.transfer import FileWeightTransfer, version_number
    from harnessrl.train.async_grpo.worker import HarnessRolloutWorker
    from harnessrl.train.trl import HarnessRollouts, on_policy_sampling
    from harnessrl.train.weights import VLLMWeightSync

    made, workers = ray_cluster
    victim = workers[1]
    spec, urls, servers = two_vllm
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    tasks = _tasks(tmp_path)
    run_dir = tmp_path / "run"
    import msgspec

    specs = [msgspec.structs.replace(spec, url=u) for u in urls]
    sync = VLLMWeightSync(urls[0], tmp_path / "weights", more_urls=urls[1:])
    transfer = FileWeightTransfer(sync, tiny_model)
    rollouts = HarnessRollouts(
        tasks=tasks, harnesses=[agent("chat", script), agent("compact", script)], engine=None,
        run_dir=run_dir, pad_token_id=0, sampling=on_policy_sampling(max_tokens=8),
        settings=RolloutSettings(retries=0, hide_host=False, concurrency=2),
        cluster=ClusterSettings(cpus_per_rollout=0.25),
        engine_factory=functools.partial(engines_from, specs))
    worker = HarnessRolloutWorker(rollouts, num_generations=2, max_inflight=4,
                                  max_staleness=0, transfer=transfer,
                                  **EVERY_ROW)
    worker.open()  # places the node actors
    runner: Any = rollouts._runner
    assert runner is not None and {n.id for n in runner.nodes} == {w.node_id for w in workers}
    swaps = _Swaps(transfer, fail_at=3, stop=servers[1].stop)
    trainer = _trainer(tiny_model, urls[0], tmp_path / "out", worker, transfer, 4, tasks)
    consumed = _consumed(worker)
    killed = threading.Event()

    def trained_from_victim() -> bool:
        ids = {tuple(s.input_ids.tolist()) for s in list(consumed)}
        keys = {r.rollout for rep in list(worker.reports) for r in rep.rows
                if r.input_ids in ids}
        return any(_node_of(run_dir, k) == victim.node_id for k in keys)

    def kill_when_ready() -> None:
        """Kills the victim once one of its rollouts was trained and its shard has
        recorded a turn of a rollout still open."""
        shard = run_dir / "shards" / victim.node_id[:16] / "trace.db"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not trainer.state.global_step >= 4:
            with contextlib.suppress(sqlite3.Error), contextlib.closing(
                    sqlite3.connect(shard)) as db:
                if trained_from_victim() and db.execute(
                        "SELECT COUNT(*) FROM turns JOIN rollouts ON key = rollout"
                        " WHERE closed IS NULL").fetchone()[0]:
                    made.remove_node(victim)
                    killed.set()
                    return
            time.sleep(0.1)

    watcher = threading.Thread(target=kill_when_ready, daemon=True)
    watcher.start()
    trainer.train()
    watcher.join(5)
    reports = list(worker.reports)
    rows = [row for report in reports for row in report.rows]
    logs = [e for e in trainer.state.log_history if "loss" in e]
    print("\nasync on a cluster:", {
        "steps": trainer.state.global_step, "stats": dict(worker.stats),
        "retired": sync.retired, "swap_seconds": [round(s, 2) for s in transfer.seconds],
        "reloads": [(r.url[-5:], round(r.ended - r.started, 2), r.error is None)
                    for r in sync.reloads]})
    assert trainer.state.global_step == 4 and len(logs) == 4 and killed.is_set()

    with TraceReader(run_dir) as store:
        records = {r.key: r for r in store.iter_rollouts()}
        # rows from every node were trained (the victim's before it died)
        ids = {tuple(s.input_ids.tolist()) for s in consumed}
        queued = {r.input_ids for r in rows if r.fate == "queued"}
        assert consumed and ids <= queued
        nodes = {records[r.rollout].metadata.get("node") for r in rows if r.input_ids in ids}
        assert {w.node_id for w in workers} <= nodes
        # the killed node's unfinished rollouts ran again elsewhere; the dead attempts'
        # turns are on its shard only, and no row came from them
        rerun = [r for r in records.values() if r.metadata.get("lost_attempts")]
        assert rerun and all(r.metadata["node"] != victim.node_id for r in rerun)
        shard = run_dir / "shards" / victim.node_id[:16] / "trace.db"
        with contextlib.closing(sqlite3.connect(shard)) as db:
            dead = {k for (k,) in db.execute("SELECT key FROM rollouts")} - set(records)
        assert dead and not dead & {r.rollout for r in rows}
        # each turn's version was served by every server in routing when it was admitted:
        # it ended after the swap to that version began, and it was received before the
        # swap to the next one began (calls admitted during a swap wait at the gate)
        for report in reports:
            for outcome in report.outcomes:
                for turn in store.turns(outcome.rollout):
                    k = version_number(turn.weight_version)
                    assert k is not None and turn.status == "ok", turn
                    assert turn.timings.done is not None
                    assert turn.timings.done >= swaps.held[k]
                    assert k + 1 not in swaps.drained or (
                        turn.timings.received < swaps.drained[k + 1]), turn
    # stale rows were dropped and counted, never trained
    trl_dropped = sum(e.get("sample/dropped_stale_total") or 0 for e in logs)
    assert worker.stats["rows_stale"] + trl_dropped > 0
    # both servers reloaded at once; the stopped one failed its reload, was taken out,
    # and the run went on with the other to the last version
    first = [r for r in sync.reloads[:2]]
    assert {r.url for r in first} == set(urls) and all(r.error is None for r in first)
    assert first[0].started < first[1].ended and first[1].started < first[0].ended
    assert urls[1] in sync.retired and sync.urls == [urls[0]]
    assert transfer.version == 5 and sync.served_version(urls[0]) == "v5"
