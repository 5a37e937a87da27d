"""Long runs, the fast parts: atomic checkpoints (written by a stand-in trainer that writes
files the way TRL's does), `--resume` refusals before anything starts, the seeded task
order and eval split, the resume's marking of interrupted rollouts in a real store, the
metrics rewind, and the per-harness figures. The kill-and-resume run with real vLLM is in
test_long_runs_vllm.py."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from harnessrl.train.config import TrainSettings, load_config
from harnessrl.train.runs import checkpoint as ckpt
from harnessrl.types import Outcome, Rollout


class StandInTrainer:
    """Writes the files TRL's trainer writes into a checkpoint (not a model: bytes)."""

    def __init__(self, step: int, fail_at: str | None = None) -> None:
        self.state = SimpleNamespace(global_step=step, save_to_json=self._state_json)
        self.fail_at = fail_at

    def _write(self, out: str, name: str, data: bytes) -> None:
        if name == self.fail_at:
            raise OSError(f"disk full while writing {name}")
        (Path(out) / name).write_bytes(data)

    def _state_json(self, path: str) -> None:
        Path(path).write_text(json.dumps({"global_step": self.state.global_step}))

    def store_flos(self) -> None:
        pass

    def save_model(self, out: str, _internal_call: bool = False) -> None:
        self._write(out, "model.safetensors", b"w" * 1000)
        self._write(out, "config.json", b"{}")
        self._write(out, "tokenizer.json", b"{}")
        self._write(out, "chat_template.jinja", b"{{ messages }}")
        self._write(out, "generation_config.json", b"{}")
        self._write(out, "training_args.bin", b"args")

    def _save_optimizer_and_scheduler(self, out: str) -> None:
        self._write(out, "optimizer.pt", b"o" * 2000)
        self._write(out, "scheduler.pt", b"s")

    def _save_scaler(self, out: str) -> None:
        pass

    def _save_rng_state(self, out: str) -> None:
        self._write(out, "rng_state.pth", b"r")


CONFIG = """run_dir = "{run}"
[model]
path = "/nonexistent"
[rollout]
harnesses = ["mini-swe-agent"]
tasks = "bundled:create-hello-file,reverse-words"
[grpo]
trainer = "async"
tasks_per_step = 1
num_generations = {generations}
[checkpoint]
every_steps = 2
"""


def _config(tmp_path: Path, generations: int = 2) -> Path:
    path = tmp_path / f"train-{generations}.toml"
    path.write_text(CONFIG.format(run=tmp_path / "run", generations=generations))
    return path


def _save(config: TrainSettings, step: int, **state) -> Path:
    from harnessrl.rollout.tasks.task import load_tasks

    ids = [t.id for t in load_tasks(config.rollout.tasks)]
    full = {"weight_version": step + 1, "task_cursor": step,
            "fingerprint": ckpt.fingerprint(config, ids), **state}
    return ckpt.save(StandInTrainer(step), ckpt.checkpoint_root(config), full,
                     config.checkpoint.keep)


# ------------------------------------------------------------------ checkpoints
def test_checkpoints_are_whole_or_not_taken_and_only_the_last_kept(tmp_path):
    config = load_config(_config(tmp_path))
    root = ckpt.checkpoint_root(config)
    for step in (2, 4, 6):
        _save(config, step)
    assert [p.name for p in ckpt.complete(root)] == ["checkpoint-4", "checkpoint-6"]
    state = ckpt.verify(root / "checkpoint-6")
    assert state["step"] == 6 and state["task_cursor"] == 6
    marker = json.loads((root / "checkpoint-6" / ckpt.MARKER).read_text())
    assert marker["files"]["optimizer.pt"]["size"] == 2000
    # a crash while step 8 is written: its staging directory is never taken
    with pytest.raises(OSError, match="disk full"):
        ckpt.save(StandInTrainer(8, fail_at="optimizer.pt"), root, {}, 2)
    assert (root / ".checkpoint-8.partial").is_dir()
    assert ckpt.resolve("latest", root) == root / "checkpoint-6"
    # RUN_DIR/model/: the model files only, linked from the checkpoint
    model = ckpt.publish_model(root / "checkpoint-6", tmp_path / "run")
    assert sorted(p.name for p in model.iterdir()) == [
        "chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
        "tokenizer.json"]
    assert ckpt.model_dir_of(root / "checkpoint-6") == root / "checkpoint-6"
    assert ckpt.model_dir_of(model) == model


def test_resume_refuses_missing_half_written_corrupt_and_changed_before_anything_starts(
        tmp_path, capsys):
    from harnessrl.cli import main

    config_path = _config(tmp_path)
    config = load_config(config_path)
    root = ckpt.checkpoint_root(config)

    def refused(*extra: str, config: Path = config_path) -> str:
        # the model path is bogus: getting past the checks would fail elsewhere
        assert main(["train", "--config", str(config), "--resume", *extra]) == 2
        return capsys.readouterr().err

    assert f"no complete checkpoint in {root}" in refused()
    # half-written: a staging dir, and a directory without its marker
    good = _save(config, 2)
    (root / ".checkpoint-4.partial").mkdir()
    half = root / "checkpoint-4"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"w")
    assert ckpt.resolve("latest", root) == good  # latest takes the whole one
    err = refused(str(half))
    assert str(half / ckpt.MARKER) in err and "half-written" in err
    # corrupt: one byte of the optimizer state changed after it was sealed
    optimizer = good / "optimizer.pt"
    optimizer.write_bytes(b"x" + optimizer.read_bytes()[1:])
    err = refused(str(good))
    assert str(optimizer) in err and "corrupt" in err
    # changed in what matters: the group size
    fresh = _save(config, 6)
    err = refused("latest", config=_config(tmp_path, generations=4))
    assert str(fresh / ckpt.STATE) in err and "grpo.num_generations: 2" in err
    assert not (tmp_path / "run" / "trace.db").exists()  # nothing started


def test_eval_model_flag_takes_only_a_whole_checkpoint(tmp_path, capsys):
    from harnessrl.cli import main

    half = tmp_path / "checkpoint-3"
    half.mkdir()
    (half / "config.json").write_text("{}")
    # a model that cannot be loaded is one line and exit code 2 (errors.CommandError)
    assert main(["eval", "--model", str(half), "--harness", "mini-swe-agent", "--tasks",
                 "bundled:create-hello-file", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert str(half / ckpt.MARKER) in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------ order and split
def test_task_order_is_seeded_per_epoch_and_a_pure_function_of_the_cursor():
    from harnessrl.train.runs.order import TaskOrder, split

    tasks = [f"t{i}" for i in range(7)]
    order = TaskOrder(tasks, seed=3)
    drawn = [order.at(i) for i in range(21)]
    for epoch in range(3):
        assert sorted(drawn[7 * epoch:7 * epoch + 7]) == sorted(tasks)
    assert drawn[:7] != tasks and drawn[:7] != drawn[7:14]
    # a resumed run at cursor 9 draws what the first run drew there
    assert [TaskOrder(tasks, seed=3).at(i) for i in range(9, 21)] == drawn[9:]
    assert drawn != [TaskOrder(tasks, seed=4).at(i) for i in range(21)]
    train, held = split(tasks, 0.3, seed=3)
    assert len(held) == 2 and set(train) | set(held) == set(tasks) and not set(train) & set(held)
    assert split(tasks, 0.3, seed=3) == (train, held)
    with pytest.raises(ValueError, match="at least 2 tasks"):
        split(["only"], 0.5, seed=0)


# ------------------------------------------------------------------ the resume's store work
def test_interrupted_rollouts_are_marked_once_and_never_planned_again(tmp_path):
    from harnessrl.store.reader import TraceReader
    from harnessrl.store.writer import TraceStore
    from harnessrl.train.runs.resume import interrupted, mark_interrupted, newest_version
    from tests.helpers import make_turn

    def meta(sample: int, attempt: int = 1, **more):
        return {"harness": "h", "harness_version": "1", "task": "t", "sample": sample,
                "attempt": attempt, **more}

    now = time.time()
    with TraceStore(tmp_path) as store:
        async def fill() -> None:
            await store.put_rollout(Rollout("done", now, now + 1, metadata=meta(0)))
            await store.put_outcome(Outcome(harness="h", harness_version="1", task="t",
                                            sample=0, rollout="done", status="done",
                                            reward=1.0))
            # sample 1: a failed attempt (closed), then one in flight at the crash
            await store.put_rollout(Rollout("try1", now, now + 1, metadata=meta(1)))
            await store.put_rollout(Rollout("try2", now + 2, metadata=meta(1, 2)))
            await store.put_rollout(Rollout("eval", now + 3, metadata=meta(
                2, purpose="eval")))
            await store.put_rollout(Rollout("own", now + 4))  # not the runner's
            turn = msgspec.structs.replace(make_turn("try2", 0), weight_version="v7")
            await store.add_turn(turn)
        asyncio.run(fill())
        assert [[r.key for r in rs] for rs in interrupted(store)] == [
            ["try1", "try2"], ["eval"]]
        marked = mark_interrupted(store, "resumed from checkpoint-2")
        assert interrupted(store) == [] and mark_interrupted(store, "again") == []
    assert [(o.sample, o.rollout, o.status, o.attempts) for o in marked] == [
        (1, "try2", "infra_error", 2), (2, "eval", "infra_error", 1)]
    with TraceReader(tmp_path) as store:
        records = {r.key: r for r in store.iter_rollouts()}
        assert records["try2"].closed is not None
        assert records["try2"].metadata["interrupted"] == "resumed from checkpoint-2"
        assert records["eval"].metadata["purpose"] == "eval"
        assert len(store.turns("try2")) == 1  # the turns stay
        assert newest_version(store) == 7
        outcomes = store.outcomes()
    assert [o.sample for o in outcomes] == [0, 1, 2]
    assert all(o.error.startswith("interrupted: ") for o in outcomes if o.status != "done")


def test_metrics_rewind_to_the_checkpoint_step(tmp_path):
    from harnessrl.train.runs.resume import UNDONE_FILE, rewind_metrics

    metrics = tmp_path / "metrics.jsonl"
    lines = [{"step": 1}, {"step": 2}, {"step": 2, "eval": {}}, {"step": 3}]
    metrics.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 4, "tor')
    assert rewind_metrics(metrics, 2) == 2
    assert [json.loads(x) for x in metrics.read_text().splitlines()] == lines[:3]
    assert len((tmp_path / UNDONE_FILE).read_text().splitlines()) == 2


# ------------------------------------------------------------------ figures
@pytest.mark.slow  # imports TRL's async trainer, which imports vLLM
def test_group_metrics_carry_per_harness_outcomes_for_report_to():
    from harnessrl.train.async_grpo.groups import group_metrics, score_group
    from harnessrl.train.async_grpo.loop import step_line
    from tests.helpers import make_turn

    def outcome(h: str, sample: int, status: str = "done", verifier: float = 0.0):
        return Outcome(harness=h, harness_version="1", task="t", sample=sample,
                       rollout=f"{h}{sample}", status=status,  # type: ignore[arg-type]
                       reward=verifier if status == "done" else None,
                       verifier_reward=verifier if status == "done" else None,
                       tool_calls=2 * sample, turns=3, completion_tokens=10 * (sample + 1))

    finished = [(outcome("a", 0, verifier=1.0), [make_turn("a0", 0)]),
                (outcome("a", 1), [make_turn("a1", 0)]),
                (outcome("b", 2, status="infra_error"), [])]
    report, _ = score_group(0, "t", finished)
    m = group_metrics(report, current=1)
    assert m["harnessrl/a/pass_rate"] == (1.0, 2) and m["harnessrl/a/tool_calls"] == (2.0, 2)
    assert m["harnessrl/a/completion_tokens"] == (30.0, 2) and m["harnessrl/a/turns"] == (6, 2)
    assert m["harnessrl/b/infra_errors_total"] == 1.0 and "harnessrl/b/pass_rate" not in m
    from harnessrl.train.trl_compat import async_trl

    _reduce_metric = async_trl().trainer_module._reduce_metric  # how TRL logs a step

    logs = {k: _reduce_metric(k, [v]) for k, v in m.items()}
    line = step_line(1, logs, "v2")
    assert line["harnesses"]["a"]["pass_rate"] == 0.5
    assert line["harnesses"]["a"]["reward"] == 0.5
    assert line["harnesses"]["b"]["infra_errors_total"] == 1.0


def test_an_eval_pass_line_and_report_to_keys_and_plot(tmp_path):
    from harnessrl.rollout.evaluate import evaluate
    from harnessrl.train.runs.eval_during import EvalPass, eval_lines, plot

    def outcome(h: str, task: str, solved: bool, status: str = "done"):
        return Outcome(harness=h, harness_version="1", task=task, sample=0, rollout="k",
                       status=status, verifier_reward=float(solved) if status == "done"
                       else None, tool_calls=3)  # type: ignore[arg-type]

    rows = evaluate([outcome("a", "t1", True), outcome("a", "t2", False),
                     outcome("new", "t1", False), outcome("new", "t2", False, "infra_error")],
                    k=1)
    done = EvalPass(4, rows, 12.5, ["v3", "v4"])
    logs = done.logs()
    assert logs["eval_a/pass_at_1"] == 0.5 and logs["eval_a/tool_calls_per_solved"] == 3.0
    assert logs["eval_new/infra_errors"] == 1.0 and "eval_new/tool_calls_per_solved" not in logs
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 3}) + "\n" + json.dumps(done.line()) + "\n")
    [line] = eval_lines(metrics)
    assert line["step"] == 4 and line["eval"]["a"]["ci_low"] < 0.5 < line["eval"]["a"]["ci_high"]
    pytest.importorskip("matplotlib")
    png = plot(metrics, tmp_path / "eval.png")
    assert png is not None and png.read_bytes()[:4] == b"\x89PNG"


def test_an_eval_pass_due_while_one_runs_is_queued_and_the_last_step_gets_one(tmp_path,
                                                                                capsys):
    """Steps 2, 4 and 6 are due while step 2's pass runs: 6 replaces 4 in the queue and runs
    when 2's ends; the last step (7, no multiple of 2) gets a pass too."""
    import threading

    from harnessrl.train.runs.eval_during import EvalDuringTraining, EvalPass

    release = threading.Event()
    ran: list[int] = []

    class Stand(EvalDuringTraining):
        def _run(self, step: int) -> None:  # a pass: no rollouts, only its order
            release.wait(5)
            ran.append(step)
            with self._lock:
                self._done.append(EvalPass(step, [], 0.0, []))

    evaluation = Stand(every_steps=2, tasks=[], harnesses=[], samples=1, settings=None,  # type: ignore[arg-type]
                       sampling=None, shaping=None, run_dir=tmp_path,  # type: ignore[arg-type]
                       rollouts=object())  # type: ignore[arg-type]
    assert evaluation.maybe_start(2, last=7)
    assert not evaluation.maybe_start(3, last=7)  # not due
    assert not evaluation.maybe_start(4, last=7) and not evaluation.maybe_start(6, last=7)
    assert "eval at step 4 skipped: step 6's pass replaces it" in capsys.readouterr().err
    release.set()
    evaluation.wait(5)
    assert ran == [2, 6] and [p.step for p in evaluation.finished()] == [2, 6]
    assert evaluation.maybe_start(7, last=7)  # idle again: the last step starts at once
    evaluation.wait(5)
    assert ran == [2, 6, 7] and not evaluation.due(7) and evaluation.due(7, last=7)


# ------------------------------------------------------------------ the async trainer's parts
class StandInAsyncTrainer:
    """Takes what TRL's `AsyncGRPOTrainer` takes and, given no transfer, builds its own as
    TRL builds its NCCL client from the model (named as such: a string here)."""

    def __init__(self, *, rollout_worker: object = None, weight_transfer: object = None,
                 **_: object) -> None:
        self.rollout_worker = rollout_worker
        self.weight_transfer = weight_transfer or "TRL's own NCCL client"
        self.model_version = 0


@pytest.mark.parametrize("weight_transfer", ["file", "trl"])
def test_the_async_trainers_parts_are_built_by_their_constructors(tmp_path, weight_transfer):
    """A resumed run's first version reaches the transfer, the worker and the trainer as
    each is built, and the trainer's transfer is the versioned one (around TRL's own
    client when TRL builds it); the run holds the trainer it built."""
    from rich.console import Console

    from harnessrl.rollout.tasks.task import load_tasks
    from harnessrl.train.async_grpo.loop import ASYNC, _transfer, versioned
    from harnessrl.train.async_grpo.transfer import FileMover
    from harnessrl.train.async_grpo.worker import HarnessRolloutWorker
    from harnessrl.train.runs.long_run import LongRun

    config = load_config(_config(tmp_path))
    config = msgspec.structs.replace(config, grpo=msgspec.structs.replace(
        config.grpo, weight_transfer=weight_transfer))
    long = LongRun(config, tmp_path / "run", load_tasks(config.rollout.tasks), Console(),
                   tmp_path / "metrics.jsonl", ASYNC)
    sync = SimpleNamespace()  # stand-in: nothing is synced here
    transfer = _transfer(config, sync, tmp_path, version=7)  # type: ignore[arg-type]
    worker = HarnessRolloutWorker(SimpleNamespace(), num_generations=2,  # type: ignore[arg-type]
                                  max_inflight=1, max_staleness=1, transfer=transfer,
                                  first_version=7)
    trainer = long.trainer_class(versioned(StandInAsyncTrainer, transfer, 7))(
        rollout_worker=worker, weight_transfer=transfer)
    assert trainer.weight_transfer is transfer and worker.transfer is transfer
    assert isinstance(transfer.inner, FileMover) == (weight_transfer == "file")
    if weight_transfer == "trl":
        assert transfer.inner == "TRL's own NCCL client"
    assert trainer.model_version == transfer.version == worker._version == 7
    assert long.trainer is trainer and hasattr(trainer, "_save_checkpoint")


# ------------------------------------------------------------------ one seam, both trainers
class StandInSyncTrainer(StandInTrainer):
    """What the sync trainer (TRL's GRPOTrainer) holds that its seam reads: its args,
    group size and rollout function."""

    def __init__(self, step: int, rollout_func: object) -> None:
        super().__init__(step)
        self.args = SimpleNamespace(per_device_train_batch_size=4,
                                    gradient_accumulation_steps=1, world_size=1)
        self.num_generations = 2
        self.rollout_func = rollout_func
        self.accelerator = SimpleNamespace(unwrap_model=lambda model: model)
        self.model = object()


@pytest.mark.parametrize("trainer", ["async", "sync"])
def test_either_trainer_checkpoints_through_one_seam(tmp_path, monkeypatch, trainer):
    """Both trainers satisfy `long_run.Seam`; `long_run` builds the run by its constructor
    for each, and its trainer class writes a checkpoint whose state is the seam's cursor
    and weight version (the async worker's and TRL's version; the sync trainer's groups
    drawn and the step it synced)."""
    from rich.console import Console

    from harnessrl.train import loop
    from harnessrl.train.async_grpo.loop import ASYNC
    from harnessrl.train.runs import long_run as lr
    from harnessrl.train.trl import HarnessRollouts

    config = load_config(_config(tmp_path))
    config = msgspec.structs.replace(config, grpo=msgspec.structs.replace(
        config.grpo, trainer=trainer))
    seam = {"async": ASYNC, "sync": loop.SYNC}[trainer]
    assert isinstance(seam, lr.Seam)
    typed: lr.Seam = seam  # pyright checks that each satisfies the protocol
    long = lr.long_run(config, [SimpleNamespace(id="create-hello-file")], Console(),  # type: ignore[list-item]
                       None, typed)
    assert long.seam is seam and long.resumed_step == 0 and long.resume_from is None
    monkeypatch.setattr(ckpt, "publish_checkpoint", lambda *_: tmp_path / "run" / "model")
    if trainer == "async":
        worker = SimpleNamespace(cursor=5)

        class Async(StandInTrainer):
            def __init__(self) -> None:
                super().__init__(6)
                self.rollout_worker, self.model_version = worker, 9
        built = long.trainer_class(Async)()
        want = {"task_cursor": 5, "weight_version": 9}
    else:
        pushed: list[str] = []
        sync = SimpleNamespace(engines=[], push=lambda _model, name: pushed.append(name))
        rollouts = HarnessRollouts(tasks=[], harnesses=[SimpleNamespace(name="h")],  # type: ignore[list-item]
                                   engine=SimpleNamespace(), run_dir=tmp_path,  # type: ignore[arg-type]
                                   pad_token_id=0, sync=sync)  # type: ignore[arg-type]
        rollouts.ensure_synced(object(), 6)  # the step-6 weights, as its step end does
        assert pushed == ["step-6"]
        built = long.trainer_class(StandInSyncTrainer)(6, rollouts)
        want = {"task_cursor": 12, "weight_version": 6}  # 6 steps of 4 rows in groups of 2
    assert long.trainer is built
    built._save_checkpoint(None, None)
    state = ckpt.verify(ckpt.checkpoint_root(config) / "checkpoint-6")
    assert {k: state[k] for k in want} == want and state["step"] == 6
    assert state["fingerprint"] == long.fingerprint
