"""`harnessrl train` as several processes (issue 38): DDP on CPU (gloo), 2 processes under
torchrun, the trainer built as `harnessrl train` builds it (tests/ddp_child.py; its rows
come from a scripted rollout worker, named as such). After a step the parameters are
equal on both ranks, differ from before, and are what the transfer received on the main
process. What cannot work with several processes is refused before anything starts.
(Where a newer TRL keeps the async trainer: tests/test_trl_compat.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.train.async_grpo.processes import check_processes
from harnessrl.train.config import GRPOSettings, TrainSettings

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("grpo", "says"), [
    (GRPOSettings(trainer="sync"), 'grpo.trainer = "sync"'),
    (GRPOSettings(tasks_per_step=1, num_generations=3), "the 3 rows of a step"),
])
def test_several_processes_refuse_what_works_in_one_only(monkeypatch, grpo, says) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="2 trainer processes") as refused:
        check_processes(TrainSettings(grpo=grpo))
    assert says in str(refused.value)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert check_processes(TrainSettings(grpo=grpo)) == 1


def test_harnessrl_train_refuses_before_loading_anything(monkeypatch, tmp_path) -> None:
    from harnessrl.train import loop

    monkeypatch.setenv("WORLD_SIZE", "2")
    started = []
    monkeypatch.setattr(loop, "resolve_model", lambda *a: started.append(a))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a", "instruction": "x", "verify": ["true"]}\n'
                     '{"id": "b", "instruction": "y", "verify": ["true"]}\n')
    config = TrainSettings(run_dir=str(tmp_path / "run"),
                         grpo=GRPOSettings(trainer="sync"))
    import msgspec

    config = msgspec.structs.replace(config, rollout=msgspec.structs.replace(
        config.rollout, tasks=str(tasks)))
    with pytest.raises(ValueError, match=r'grpo\.trainer = "sync"'):
        loop.train(config)
    assert not started


@pytest.mark.slow
def test_two_process_ddp_step_leaves_equal_parameters_on_both_ranks(tiny_model, tmp_path):
    import torch

    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
               str(ROOT / "tests" / "ddp_child.py"), str(tiny_model), str(tmp_path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2] and ranks[0]["backend"] == "gloo"
    # one main process, known before anything else set accelerate up (harnessrl train asks
    # first: a plain torchrun on a CPU made every rank a main process)
    assert [r["main_first"] for r in ranks] == [True, False]
    assert ranks[0]["ddp"] == "DistributedType.MULTI_CPU"
    # a step's 4 rows spread over the ranks: 2 each
    assert [r["per_device"] for r in ranks] == [2, 2] and ranks[0]["step"] == 1
    before, after = ranks[0]["before"], ranks[0]["after"]
    assert all(torch.equal(before[n], ranks[1]["before"][n]) for n in before)
    assert all(torch.equal(after[n], ranks[1]["after"][n]) for n in after)
    assert any(not torch.equal(after[n], before[n]) for n in after)
    # the main process's transfer got the full weights after the step (cold sync + 1)
    sent = ranks[0]["sent"]
    assert ranks[0]["sends"] == 2 and ranks[1]["sent"] is None
    assert set(sent) == set(after) and all(torch.equal(sent[n], after[n]) for n in after)


def _free_port() -> int:
    from harnessrl.proxy.engines.vllm_server import free_port

    return free_port()

