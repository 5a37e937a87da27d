"""The command line over a real store: export and report."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from harnessrl.cli import main
from harnessrl.store.writer import TraceStore
from harnessrl.types import Rollout
from tests.helpers import make_turn


def test_export_and_report_commands(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich would shorten names on a narrow terminal
    async def write(store: TraceStore) -> None:
        await store.put_rollout(Rollout("k", 0.0, metadata={"harness": "opencode"}))
        for i in range(2):
            await store.add_turn(make_turn("k", i))

    with TraceStore(tmp_path) as store:
        asyncio.run(write(store))
    assert main(["export", str(tmp_path), "-o", str(tmp_path / "t.jsonl")]) == 0
    assert len((tmp_path / "t.jsonl").read_text().splitlines()) == 2
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "opencode" in out and "wrote 2 turns" in out
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])["rollout"] == "k"


def test_cluster_nodes_get_one_engine_spec_per_url() -> None:
    """`run --cluster ray`: the driver's engine URLs, as `--engine-url` lists them (spaces
    after the commas too), each a spec the nodes call by URL; none, the spec as given."""
    from harnessrl.cli.run import node_specs
    from harnessrl.proxy.engines.build import EngineSettings

    spec = EngineSettings(kind="chat", model="m")
    specs = node_specs(spec, "http://127.0.0.1:1/v1, http://127.0.0.1:2/v1")
    assert [(s.url, s.model) for s in specs] == [("http://127.0.0.1:1/v1", None),
                                                 ("http://127.0.0.1:2/v1", None)]
    assert [(s.url, s.model) for s in node_specs(spec, "")] == [("", "m")]
