"""The viewer's rollouts per node for a `--cluster ray` run: counted from the node the
driver writes into each rollout record (rollout.cluster.ClusterRunner._commit), as the
run's store holds them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Literal

from starlette.testclient import TestClient

from harnessrl.store.writer import TraceStore
from harnessrl.types import Outcome, Rollout
from harnessrl.ui.app import build_app
from harnessrl.ui.queries import RunReader

Status = Literal["done", "infra_error"]


def fill(run_dir: Path, rows: list[tuple[str, dict[str, Any], Status, float]]) -> None:
    """(key, metadata, outcome status, verifier reward) per rollout."""
    with TraceStore(run_dir) as store:
        async def put() -> None:
            for n, (key, metadata, status, reward) in enumerate(rows):
                await store.put_rollout(Rollout(key, 1000.0 + n, 1001.0 + n, metadata={
                    "harness": "h", "task": f"t{n}", "sample": 0, "attempt": 1, **metadata}))
                await store.put_outcome(Outcome(
                    harness="h", harness_version="1", task=f"t{n}", sample=0, rollout=key,
                    status=status, reward=reward if status == "done" else None,
                    verifier_reward=reward if status == "done" else None))

        asyncio.run(put())


def test_rollouts_per_node_from_the_stored_records(tmp_path: Path) -> None:
    lost = {"lost_attempts": ["node aaaa lost: ActorDiedError: ..."]}
    fill(tmp_path, [
        ("k1", {"node": "aaaa1111"}, "done", 1.0),
        ("k2", {"node": "aaaa1111"}, "done", 0.0),
        ("k3", {"node": "bbbb2222"}, "done", 1.0),
        ("k4", {"node": "bbbb2222", **lost}, "done", 1.0),  # rerun here after aaaa died
        ("k5", {"node": "bbbb2222"}, "infra_error", 0.0),
    ])
    nodes = RunReader(tmp_path).node_stats()
    assert nodes == [
        {"node": "aaaa1111", "outcomes": 2, "scored": 2, "passed": 1, "infra_errors": 0,
         "reruns": 0},
        {"node": "bbbb2222", "outcomes": 3, "scored": 2, "passed": 2, "infra_errors": 1,
         "reruns": 1}]
    run = TestClient(build_app(tmp_path)).get("/api/runs").json()["runs"][0]
    assert run["nodes"] == nodes


def test_a_run_on_one_machine_has_no_nodes(tmp_path: Path) -> None:
    fill(tmp_path, [("k1", {}, "done", 1.0), ("k2", {}, "done", 0.0)])
    assert RunReader(tmp_path).node_stats() == []
    assert RunReader(tmp_path).summary()["nodes"] == []
