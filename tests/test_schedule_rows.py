"""Colocated on and off give the same rows for the same seed: the schedule decides when
rollouts run, never what they hold. A small agent (a real process, `openai` SDK, its own
tool calls) against the scripted engine (named as such: the task's reference solution as
tool calls, so every run samples the same tokens), the async rollout worker, and a
stand-in trainer that takes one step's rows, steps, syncs (a new weight version) and
goes on, as TRL's async trainer drives the schedule. Only the weight versions that
sampled a row may differ between the two.

Colocated, no rollout starts during a step, and the sampler plans exactly the groups the
steps train."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from harnessrl.proxy.engines.scripted import ScriptedEngine
from harnessrl.rollout.run import oracle_policy
from harnessrl.rollout.runner import RolloutSettings
from harnessrl.rollout.tasks.task import load_tasks
from harnessrl.train.async_grpo.schedule import Schedule
from harnessrl.train.async_grpo.worker import HarnessRolloutWorker
from harnessrl.train.trl import HarnessRollouts
from tests.helpers import EVERY_GROUP_KEPT, train_toml
from tests.test_train import AGENT, agent

STEPS, GENERATIONS, TASKS_PER_STEP = 2, 2, 2
STEP_ROWS = GENERATIONS * TASKS_PER_STEP


def _tasks(tmp_path: Path) -> Any:
    tasks_file = tmp_path / "tasks" / "tasks.jsonl"
    tasks_file.parent.mkdir(parents=True)
    tasks_file.write_text("\n".join(json.dumps(t) for t in [
        {"id": "hello", "instruction": "Create hello.txt containing hi",
         "verify": ["grep -qx hi hello.txt"], "solution": ["echo hi > hello.txt"]},
        {"id": "count", "instruction": "Write the number 3 to n.txt",
         "verify": ["grep -qx 3 n.txt"], "solution": ["echo 3 > n.txt"]},
    ]))
    return load_tasks(tasks_file)


def _run(tmp_path: Path, tokenizer: Any, colocated: bool) -> dict[str, Any]:
    tmp_path.mkdir(parents=True)
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    tasks = _tasks(tmp_path)
    engine = ScriptedEngine(tokenizer, oracle_policy(tasks), model="policy")
    engine.weight_version = "v1"
    rollouts = HarnessRollouts(tasks=tasks, harnesses=[agent("agent", "solve", script)],
                               engine=engine, run_dir=tmp_path / "run",
                               pad_token_id=tokenizer.pad_token_id,
                               settings=RolloutSettings(retries=0, hide_host=False,
                                                        concurrency=4))
    schedule = Schedule(colocated=colocated, step_groups=TASKS_PER_STEP, steps=STEPS)
    # the oracle passes every rollout: groups without spread are kept (advantage 0), as
    # the rows, not the filter, are what this compares
    worker = HarnessRolloutWorker(rollouts, num_generations=GENERATIONS, max_inflight=4,
                                  max_staleness=STEPS, drop_uniform=False,
                                  queue_maxsize=TASKS_PER_STEP if colocated else 0,
                                  schedule=schedule)
    starts: list[float] = []
    run_planned = rollouts.run_planned

    def recorded(planned: Any) -> Any:
        starts.append(time.monotonic())
        return run_planned(planned)

    rollouts.run_planned = recorded  # type: ignore[method-assign]
    trained, steps = [], []
    worker.start()
    try:
        gate = rollouts.gates()[0]
        for step in range(1, STEPS + 1):
            groups = [worker.rollout_buffer.get(timeout=120) for _ in range(TASKS_PER_STEP)]
            batch = [s for g in groups for s in g.samples]
            assert len(batch) == STEP_ROWS
            began = time.monotonic()
            schedule.step_begin(step)
            trained += batch
            time.sleep(1.0)  # forward, backward, optimizer
            schedule.syncing()
            gate.hold(30)
            engine.weight_version = f"v{step + 1}"
            worker.update_model_version(step)
            gate.release()
            schedule.step_end()
            steps.append((began, time.monotonic()))
    finally:
        worker.stop()
    return {"trained": trained, "worker": worker, "starts": starts, "steps": steps}


def _rows(samples: list[Any]) -> dict[int, list[tuple[Any, ...]]]:
    """Per group, its rows as the trainer gets them, the weight version left out."""
    out: dict[int, list[tuple[Any, ...]]] = {}
    for s in samples:
        out.setdefault(s.group_id, []).append((
            tuple(s.input_ids.tolist()), tuple(s.completion_mask.tolist()),
            tuple(round(x, 6) for x in s.old_log_probs.tolist()), s.advantage,
            s.metrics["reward"]))
    return {g: sorted(rows) for g, rows in out.items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any
         ) -> dict[bool, dict[str, Any]]:
    root = tmp_path_factory.mktemp("schedule-rows")
    return {colocated: _run(root / str(colocated), tokenizer, colocated)
            for colocated in (True, False)}


def test_colocated_on_and_off_train_the_same_rows(runs):
    on, off = _rows(runs[True]["trained"]), _rows(runs[False]["trained"])
    shared = set(on) & set(off)
    assert shared, (sorted(on), sorted(off))
    for group in shared:
        assert on[group] == off[group], f"group {group} differs"
    # every row carries real tokens, some sampled, with a reward
    assert all(any(mask) and ids for rows in on.values() for ids, mask, *_ in rows)


def test_colocated_starts_no_rollout_during_a_step_and_samples_what_is_trained(runs):
    on = runs[True]
    for began, ended in on["steps"]:
        during = [t for t in on["starts"] if began < t < ended]
        assert not during, f"{len(during)} rollouts started during the step"
    worker = on["worker"]
    # the sampler planned exactly the groups the steps needed, and each one was trained
    rows_per_group = STEP_ROWS // TASKS_PER_STEP  # one row per rollout with this agent
    assert worker.cursor == STEPS * STEP_ROWS // rows_per_group
    assert worker.stats["rollouts"] == len(worker.trained_rollouts) == STEPS * STEP_ROWS
    # overlapped, the sampler ran on during the steps
    off = runs[False]
    assert any(began < t < ended for began, ended in off["steps"] for t in off["starts"])


# ------------------------------------------------------------------ real vLLM, the whole loop
@pytest.mark.vllm
@pytest.mark.slow
def test_harnessrl_train_colocated_on_real_vllm_records_the_schedule(
        vllm_tiny, tmp_path, tiny_model, monkeypatch):
    """`harnessrl train` with the async trainer, real vLLM (the tiny model) and the
    schedule forced on: every step line has the schedule's figures, each phase took time,
    the phase callbacks came in order, and every rollout sampled was trained."""
    import harnessrl.harnesses
    from harnessrl.train.config import load_config
    from harnessrl.train.loop import train
    from tests.test_train import QUIET

    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    scripted_agent = agent("agent-solve", "solve", script)
    monkeypatch.setattr(harnessrl.harnesses, "get", lambda _name: scripted_agent)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps({"id": name, "instruction": f"Create {name}.txt",
                                           "verify": [f"test -f {name}.txt"],
                                           "timeout": 45}) for name in ("a", "b")))
    path = train_toml(
        tmp_path / "train.toml", run_dir=tmp_path / "run", model=tiny_model,
        url=vllm_tiny.url, max_tokens=16, harnesses=["agent-solve"], tasks=tasks,
        grpo={**EVERY_GROUP_KEPT, "steps": 2, "num_generations": 2, "tasks_per_step": 1,
              "max_inflight": 4, "learning_rate": 1.0e-3},
        schedule={"colocated": "on"})
    phases: list[str] = []
    lines = train(load_config(path), console=QUIET, on_phase=phases.append)
    assert [line["step"] for line in lines] == [1, 2]
    last = lines[-1]["schedule"]
    assert last["colocated"] is True
    assert all(last["phase_s"][p] > 0 for p in ("sampling", "training", "syncing"))
    assert last["rollouts_sampled"] >= 2 and last["rows_trained"] >= 4
    assert last["trainer_tokens_per_s"] > 0
    # the rollouts the sampler finished were (nearly) all trained: at most one group
    # finished after the last step began
    assert last["rollouts_trained"] >= last["rollouts_sampled"] - 2
    assert phases[:3] == ["training step 1", "syncing weights", "sampling"]
    assert phases[3:] == ["training step 2", "syncing weights", "sampling"]
