"""Long runs end to end on a CPU: real vLLM serving the tiny model, TRL's async trainer,
scripted agents (real processes calling the proxy through the `openai` SDK; their loop is
a short script, tests/long_run_agent_script.py, the model is real).

`harnessrl train` (async, 4 steps, a checkpoint every 2, eval every 2) runs as a process
and is killed with SIGKILL once its step-2 checkpoint is whole; `--resume latest` finishes
steps 3 and 4. Then the final model directory is served by a second vLLM through
`harnessrl eval --model`. The sync trainer (TRL's GRPOTrainer) goes through the same:
killed after its step-2 checkpoint, resumed, evaluated while it trains."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from tests import long_run_agent
from tests.helpers import EVERY_REPLY_TRAINED, train_toml

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
QUIET = Console(file=open(os.devnull, "w"))  # noqa: SIM115

TASKS = [{"id": f"t{i}", "instruction": f"Finish job {i}", "verify": ["test -f done.txt"],
          "timeout": 120} for i in range(4)]


def _config(tmp_path: Path, model: Path, url: str, trainer: str = "async",
            harness: str = "agent-chat") -> Path:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps(t) for t in TASKS))
    only_async = {"max_inflight": 2, "max_staleness": 8} if trainer == "async" else {}
    return train_toml(
        tmp_path / "train.toml", run_dir=tmp_path / "run", model=model, url=f"{url}/v1",
        max_tokens=8, harnesses=[harness], tasks=tasks, rollout={"concurrency": 2},
        grpo={**EVERY_REPLY_TRAINED, "trainer": trainer, "steps": 4, "num_generations": 2,
              "tasks_per_step": 1, **only_async,
              "learning_rate": 1e-3, "report_to": ["tensorboard"]},
        checkpoint={"every_steps": 2, "keep": 2},
        eval={"every_steps": 2, "holdout": 0.25, "harnesses": ["agent-chat", "agent-fresh"],
              "samples": 1})


def _run_until_checkpoint(config: Path, root: Path, step: int) -> float:
    """`harnessrl train` as a process, killed (SIGKILL) as soon as checkpoint-<step> is
    whole; the time of the kill."""
    process = subprocess.Popen(
        [sys.executable, str(Path(long_run_agent.__file__)), "train", "--config",
         str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    marker = root / f"checkpoint-{step}" / "COMPLETE.json"
    deadline = time.monotonic() + 900
    try:
        while not marker.exists():
            if process.poll() is not None:
                raise AssertionError(f"train exited {process.returncode} before its "
                                     f"checkpoint: {process.stderr.read().decode()[-3000:]}")
            assert time.monotonic() < deadline, "no checkpoint in 15 minutes"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        killed = time.time()
    finally:
        process.kill()
        process.wait(60)
    return killed


class Probe:
    """What the resumed trainer holds when it begins: step, parameters, optimizer."""

    def __init__(self) -> None:
        self.seen: dict = {}

    def callback(self):
        from transformers import TrainerCallback

        probe = self

        class OnBegin(TrainerCallback):
            def on_train_begin(self, args, state, control, model=None, optimizer=None,
                               **_):
                import copy

                probe.seen = {"step": state.global_step,
                              "params": {k: v.detach().clone()
                                         for k, v in model.state_dict().items()},
                              "optimizer": copy.deepcopy(optimizer.state_dict())}

        return OnBegin()


def _assert_loaded_exactly(seen: dict, checkpoint: Path) -> None:
    import torch
    from safetensors.torch import load_file

    saved = load_file(str(checkpoint / "model.safetensors"))
    assert saved and set(saved) <= set(seen["params"])
    for name, tensor in saved.items():
        assert torch.equal(tensor, seen["params"][name]), name
    want = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    got = seen["optimizer"]
    assert want["param_groups"] == got["param_groups"]
    assert want["state"].keys() == got["state"].keys() and want["state"]
    for index, slots in want["state"].items():
        for key, value in slots.items():
            assert torch.equal(value, got["state"][index][key]), (index, key)


def _version(name: str | None) -> int:
    return int(name[1:]) if name and name.startswith("v") else -1


def _tensorboard(root: Path) -> dict[str, list[int]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps: dict[str, list[int]] = {}
    for events in root.rglob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            steps.setdefault(tag, []).extend(e.step for e in accumulator.Scalars(tag))
    return steps


@pytest.mark.vllm
@pytest.mark.slow
def test_kill_after_step_two_then_resume_finishes_with_eval_and_a_servable_model(
        vllm_tiny, tiny_model, tmp_path, monkeypatch):
    from harnessrl.store.reader import TraceReader
    from harnessrl.train.async_grpo import worker as async_grpo
    from harnessrl.train.config import load_config
    from harnessrl.train.loop import train

    config_path = _config(tmp_path, tiny_model, vllm_tiny.url)
    run = tmp_path / "run"
    root = run / "checkpoints"
    killed = _run_until_checkpoint(config_path, root, 2)
    with TraceReader(run) as store:
        before = {r.key: r for r in store.iter_rollouts()}
        versions_before = {t.weight_version for t in store.iter_turns()}
        outcomes_before = {(o.harness, o.task, o.sample) for o in store.outcomes()}
    open_at_kill = {k for k, r in before.items() if r.closed is None}
    assert open_at_kill, "no rollout was in flight at the kill"

    # the resumed run, in this process: what it loads and what it queues for training
    import harnessrl.harnesses as registry

    known = registry.get
    monkeypatch.setattr(registry, "get", lambda name: long_run_agent.harness(name)
                        if name.startswith("agent-") else known(name))
    queued: list[str] = []
    real = async_grpo.rollout_sample

    def recording(s, *args, **kwargs):
        queued.append(s.rollout)
        return real(s, *args, **kwargs)

    monkeypatch.setattr(async_grpo, "rollout_sample", recording)
    probe = Probe()
    resumed_at = time.time()
    steps = train(load_config(config_path), console=QUIET, resume="latest",
                  callbacks=[probe.callback()])

    # steps 3 and 4, from exactly the checkpoint's parameters and optimizer state
    assert [s["step"] for s in steps] == [3, 4]
    assert probe.seen["step"] == 2
    _assert_loaded_exactly(probe.seen, root / "checkpoint-2")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "eval" not in x] == [1, 2, 3, 4]
    # weight versions strictly increase across the crash
    served = [_version(s["weight_version"]) for s in steps]
    assert min(served) > max(_version(v) for v in versions_before if v)
    with TraceReader(run) as store:
        records = {r.key: r for r in store.iter_rollouts()}
        outcomes = store.outcomes()
        after = {r.key for r in records.values() if r.created >= resumed_at}
        new_versions = {t.weight_version for k in after for t in store.turns(k)}
    assert new_versions and min(_version(v) for v in new_versions) > max(
        _version(v) for v in versions_before if v)
    # in flight at the kill: marked, kept, never trained; nothing written twice
    interrupted = {o.rollout for o in outcomes if (o.error or "").startswith("interrupted")}
    assert open_at_kill <= {k for k, r in records.items() if "interrupted" in r.metadata}
    assert interrupted and not interrupted & set(queued)
    assert queued and set(queued) <= after
    triples = [(o.harness, o.task, o.sample) for o in outcomes]
    assert len(triples) == len(set(triples)) and outcomes_before <= set(triples)
    # the eval pass of step 4: both harnesses (one never trained), in the store as eval,
    # in no training row, in metrics.jsonl and tensorboard at step 4, and plotted
    [evaluated] = [x for x in lines if "eval" in x]
    assert evaluated["step"] == 4 and set(evaluated["eval"]) == {"agent-chat", "agent-fresh"}
    for figures in evaluated["eval"].values():
        assert figures["rollouts"] + figures["infra_errors"] == 1
    split = json.loads((run / "split.json").read_text())
    eval_rollouts = {k for k, r in records.items() if r.metadata.get("purpose") == "eval"}
    assert {records[k].metadata["task"] for k in eval_rollouts} == set(split["eval"])
    assert not eval_rollouts & set(queued)
    assert {o.task for o in outcomes if o.rollout in set(queued)} <= set(split["train"])
    logged = _tensorboard(run / "trainer")
    assert logged["eval/agent-fresh/pass_at_1"] == [4] or logged.get(
        "eval/agent-fresh/infra_errors") == [4]
    assert {3, 4} & set(logged["train/harnessrl/agent-chat/pass_rate"])
    assert (run / "eval_pass_rate.png").exists() or not _has_matplotlib()

    # the final model directory, served by vLLM as it is, through `harnessrl eval`
    model = run / "model"
    names = {p.name for p in model.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json",
            "tokenizer_config.json"} <= names and not names & {"optimizer.pt"}
    print("\nlong run:", {"resumed_s_after_kill": round(resumed_at - killed, 1),
                          "interrupted": len(interrupted), "queued": len(queued),
                          "versions_before": sorted(v for v in versions_before if v),
                          "versions_after": sorted(new_versions), "eval": evaluated})
    _serve_and_eval(model, tmp_path)


@pytest.mark.vllm
@pytest.mark.slow
def test_the_sync_trainer_killed_after_step_two_resumes_with_eval(
        vllm_tiny, tiny_model, tmp_path, monkeypatch):
    """The same long run with `trainer = "sync"`: checkpoint-2 records the sync trainer's
    cursor and version (its seam), the resumed run loads it exactly and trains steps 3 and
    4 on weights named from the checkpoint's step on, in-flight rollouts are marked and
    never trained, and the eval pass of step 4 is logged with the per-harness figures."""
    from harnessrl.store.reader import TraceReader
    from harnessrl.train import trl as sync_trl
    from harnessrl.train.config import load_config
    from harnessrl.train.loop import train

    # The sync trainer keeps groups without a spread and skips their optimizer step: trained
    # on coin-flip rewards, a quarter of runs would save checkpoint-2 with no optimizer
    # state to compare. Its agent passes on even samples, so every step has a gradient.
    config_path = _config(tmp_path, tiny_model, vllm_tiny.url, trainer="sync",
                          harness="agent-split")
    run = tmp_path / "run"
    root = run / "checkpoints"
    _run_until_checkpoint(config_path, root, 2)
    state = json.loads((root / "checkpoint-2" / "harnessrl_state.json").read_text())
    assert (state["task_cursor"], state["weight_version"]) == (2, 2)  # 2 steps of 1 group
    with TraceReader(run) as store:
        before = {r.key: r for r in store.iter_rollouts()}
        outcomes_before = {(o.harness, o.task, o.sample) for o in store.outcomes()}
    open_at_kill = {k for k, r in before.items() if r.closed is None}

    import harnessrl.harnesses as registry

    known = registry.get
    monkeypatch.setattr(registry, "get", lambda name: long_run_agent.harness(name)
                        if name.startswith("agent-") else known(name))
    trained: list[str] = []  # the rollouts handed to TRL with a sample
    real = sync_trl.columns

    def recording(records, pad_token_id):
        trained.extend(r.outcome.rollout for r in records if r.sample is not None)
        return real(records, pad_token_id)

    monkeypatch.setattr(sync_trl, "columns", recording)
    probe = Probe()
    resumed_at = time.time()
    steps = train(load_config(config_path), console=QUIET, resume="latest",
                  callbacks=[probe.callback()])

    assert [s["step"] for s in steps] == [3, 4]
    assert probe.seen["step"] == 2
    _assert_loaded_exactly(probe.seen, root / "checkpoint-2")
    # step 3 sampled with the checkpoint's weights (named after its step), step 4 with 3's
    assert [s["sampled_with"] for s in steps] == [["step-2"], ["step-3"]]
    assert steps[-1]["weight_version"] == "step-4"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "eval" not in x] == [1, 2, 3, 4]
    with TraceReader(run) as store:
        records = {r.key: r for r in store.iter_rollouts()}
        outcomes = store.outcomes()
    interrupted = {o.rollout for o in outcomes if (o.error or "").startswith("interrupted")}
    assert open_at_kill <= {k for k, r in records.items() if "interrupted" in r.metadata}
    assert not interrupted & set(trained)
    assert trained and all(records[k].created >= resumed_at for k in trained)
    triples = [(o.harness, o.task, o.sample) for o in outcomes]
    assert len(triples) == len(set(triples)) and outcomes_before <= set(triples)
    evals = [x for x in lines if "eval" in x]
    assert evals and evals[-1]["step"] == 4 and {x["step"] for x in evals} <= {2, 4}
    assert set(evals[-1]["eval"]) == {"agent-chat", "agent-fresh"}
    split = json.loads((run / "split.json").read_text())
    eval_rollouts = {k for k, r in records.items() if r.metadata.get("purpose") == "eval"}
    assert {records[k].metadata["task"] for k in eval_rollouts} == set(split["eval"])
    assert not eval_rollouts & set(trained)
    logged = _tensorboard(run / "trainer")
    assert 4 in logged.get("eval/agent-fresh/pass_at_1", []) + logged.get(
        "eval/agent-fresh/infra_errors", [])
    assert {3, 4} & set(logged["train/harnessrl/agent-split/infra_errors"])
    names = {p.name for p in (run / "model").iterdir()}
    assert {"config.json", "model.safetensors"} <= names and "optimizer.pt" not in names
    print("\nsync long run:", {"interrupted": len(interrupted), "trained": len(trained),
                               "open_at_kill": len(open_at_kill), "eval": evals[-1]})


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _serve_and_eval(model: Path, tmp_path: Path) -> None:
    from harnessrl.cli import main
    from harnessrl.store.reader import TraceReader

    out = tmp_path / "served"
    code = main(["eval", "--model", str(model), "--engine-mode", "chat", "--harness", "agent-chat",
                 "--tasks", str(tmp_path / "tasks.jsonl"), "--no-hide", "--retries", "0",
                 "--max-tokens", "8", "--run-dir", str(out)])
    assert code == 0
    with TraceReader(out) as store:
        turns = list(store.iter_turns())
    assert turns and all(t.status == "ok" and t.engine == "vllm" for t in turns)
    assert (out / "eval" / "eval.md").exists()
