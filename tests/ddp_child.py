"""One process of a 2-process DDP run of harnessrl's async trainer on CPU (gloo), started by
`torchrun` from tests/test_train_ddp.py: `python -m torch.distributed.run --nproc_per_node 2
tests/ddp_child.py MODEL_DIR OUT_DIR`.

The trainer is built exactly as `harnessrl train` builds it (`async_grpo.loop.async_config`,
`async_grpo.loop._trainer`); the main process gets a *scripted rollout worker* (named as such:
it queues fixed groups of rows with fixed advantages instead of running harnesses) and a transfer
that records the weights it is sent. Each process saves its parameters before and after
training; the main process also saves what the transfer received last."""

from __future__ import annotations

import os
import queue
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


class ScriptedRolloutWorker:
    """TRL's `RolloutWorkerProtocol`, scripted: `rows` fixed rows, queued at start."""

    def __init__(self, rows: int) -> None:
        self.rollout_buffer: queue.Queue[Any] = queue.Queue()
        self.metrics_queue: queue.Queue[Any] = queue.Queue()
        self.rows = rows

    def start(self) -> None:
        import numpy as np

        from harnessrl.train.async_grpo.batches import GroupItem
        from harnessrl.train.trl_compat import async_trl

        sample = async_trl().rollout_sample
        rows = []
        for n in range(self.rows):
            ids = np.asarray([1 + (n + i) % 50 for i in range(12)], dtype=np.int64)
            mask = np.asarray([0] * 4 + [1] * 8, dtype=np.int64)
            rows.append(sample(
                prompt=[{"role": "user", "content": "x"}], completion=[], input_ids=ids,
                completion_mask=mask, old_log_probs=np.full(12, -3.0, dtype=np.float32),
                advantage=1.0 if n % 2 else -1.0, model_version=0, group_id=n // 2,
                metrics={}))
        for group in range(self.rows // 2):  # queued whole, as the harnessrl worker does
            self.rollout_buffer.put(GroupItem(group, 0, rows[2 * group:2 * group + 2],
                                              [0.0, 1.0]))

    def stop(self) -> None:
        pass

    def update_model_version(self, model_version: int) -> None:
        pass

    def check_health(self, stale_after_s: float) -> None:
        pass


class RecordingTransfer:
    """TRL's `WeightTransferProtocol`: keeps the last weights it was sent (on CPU)."""

    def __init__(self) -> None:
        self.last: dict[str, Any] = {}
        self.sends = 0

    def init_weight_transfer(self) -> None:
        pass

    def pause(self) -> None:
        pass

    def send_weights(self, iterator: Any) -> None:
        self.last = {n: t.detach().to("cpu").clone() for n, t in iterator}
        self.sends += 1

    def resume(self) -> None:
        pass

    def destroy(self) -> None:
        pass


def main(model_dir: Path, out: Path) -> None:
    import torch

    from harnessrl.rollout.tasks.task import Task
    from harnessrl.train.async_grpo.loop import _prepare, _trainer, async_config
    from harnessrl.train.async_grpo.processes import check_processes, process_state
    from harnessrl.train.config import GRPOSettings, ModelSettings, TrainSettings

    config = TrainSettings(run_dir=str(out), model=ModelSettings(path=str(model_dir)),
                         grpo=GRPOSettings(steps=1, num_generations=2, tasks_per_step=2,
                                           learning_rate=5e-2, max_staleness=4))
    assert check_processes(config) == 2
    state = process_state()  # asked before anything else sets accelerate up, as train()
    main_first = state.is_main_process
    tokenizer = _prepare(model_dir)
    args = async_config(config, out, "http://127.0.0.1:9")
    main_process = state.is_main_process
    worker = ScriptedRolloutWorker(rows=16) if main_process else None
    transfer = RecordingTransfer() if main_process else None
    tasks = [Task(id="t", instruction="x")]
    trainer = _trainer(config, tasks, model_dir, args, tokenizer, worker, transfer, [])
    rank = state.process_index

    def params() -> dict[str, Any]:
        model = trainer.accelerator.unwrap_model(trainer.model)
        return {n: p.detach().to("cpu").clone() for n, p in model.named_parameters()}

    before = params()
    trainer.train()
    torch.save({"before": before, "after": params(), "world": state.num_processes,
                "per_device": args.per_device_train_batch_size,
                "step": trainer.state.global_step, "main_first": main_first,
                "backend": state.backend, "ddp": str(trainer.accelerator.distributed_type),
                "sent": transfer.last if transfer else None,
                "sends": transfer.sends if transfer else None}, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
