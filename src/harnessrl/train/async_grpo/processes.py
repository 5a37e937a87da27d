"""`harnessrl train` as several processes (`accelerate launch`, `torchrun`): how many, and
what only one of them can do.

The main process runs vLLM, the proxy (or the cluster's shards) and the one rollout
worker; TRL's `AsyncGRPOTrainer` spreads each step's rows over the processes (DDP, FSDP or
DeepSpeed, as accelerate is configured) and gathers the weights on the main process for
the transfer. See docs/cluster.md for the launch commands and configs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from harnessrl.train.config import TrainSettings

if TYPE_CHECKING:
    from accelerate import PartialState

# Options that hold only in one process, and why (`check_processes`).
_SINGLE_PROCESS: dict[str, Callable[[TrainSettings], bool]] = {
    'grpo.trainer = "sync" (its rollout function would run in every process; the async '
    "trainer runs one rollout worker and spreads its rows over the processes)":
        lambda c: c.grpo.trainer == "sync",
}


def processes() -> int:
    """How many trainer processes were launched together (accelerate launch, torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def check_processes(config: TrainSettings) -> int:
    """The number of trainer processes; refuses, before anything starts, the options that
    hold only in one."""
    count = processes()
    if count > 1 and (bad := [why for why, applies in _SINGLE_PROCESS.items()
                              if applies(config)]):
        raise ValueError(f"{count} trainer processes (WORLD_SIZE): " + "; ".join(bad)
                         + ": works in one process only")
    rows = config.grpo.tasks_per_step * config.grpo.num_generations
    if rows % count:
        raise ValueError(f"{count} trainer processes (WORLD_SIZE): the {rows} rows of a step "
                         "(grpo.tasks_per_step * grpo.num_generations) do not split evenly "
                         "over them")
    return count




def process_state() -> PartialState:
    """accelerate's state of this trainer process: which one is the main process (it alone
    runs vLLM, the proxy, the rollout worker and prints the step lines). Without CUDA it is
    asked for CPU processes, as the trainer's own arguments are (`use_cpu`): otherwise
    accelerate takes plain `torchrun` ranks on a CPU for separate one-process runs, each its
    own main process, so every rank would start the rollout worker and print every metrics
    line, and the others' trainers would find no weight transfer."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())
