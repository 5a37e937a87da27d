"""Where the installed TRL keeps its asynchronous GRPO trainer.

TRL 1.16 has it under `trl.experimental.async_grpo`; TRL 1.18 made it stable and exports
it from `trl`. Everything harnessrl uses of it (the trainer, its config, `RolloutSample`,
and the two modules `install_cpu_support` patches) is found from the trainer class
itself, so a newer layout needs no change here beyond its place in `PLACES`.
"""

from __future__ import annotations

import functools
import importlib
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

PLACES = ("trl", "trl.experimental.async_grpo")  # newest first


@dataclass(frozen=True)
class AsyncTRL:
    trainer: Any  # AsyncGRPOTrainer
    config: Any  # AsyncGRPOConfig
    rollout_sample: Any  # RolloutSample
    trainer_module: ModuleType  # where the trainer looks up its globals
    packing: ModuleType  # the packed tree attention's kernels


@functools.cache
def async_trl() -> AsyncTRL:
    """TRL's asynchronous GRPO, from the first place in `PLACES` that has it."""
    tried = []
    for place in PLACES:
        try:
            module = importlib.import_module(place)
            trainer, config = module.AsyncGRPOTrainer, module.AsyncGRPOConfig
        except (ImportError, AttributeError) as error:
            tried.append(f"{place}: {error}")
            continue
        trainer_module = sys.modules[trainer.__module__]
        package = trainer_module.__name__.rpartition(".")[0]
        return AsyncTRL(trainer=trainer, config=config,
                        rollout_sample=trainer_module.RolloutSample,
                        trainer_module=trainer_module,
                        packing=importlib.import_module(f"{package}.packing"))
    raise ImportError("no asynchronous GRPO trainer in the installed TRL (tried "
                      + "; ".join(tried) + "); harnessrl needs TRL >= 1.16")
