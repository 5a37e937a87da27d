"""The one door to TRL's and transformers' private names: every call of a private method,
every override of one, every module global replaced and every private attribute read
goes through a function here, and `PRIVATE` lists each name so that
`tests/test_trl_compat.py` fails naming the one an upgrade removed.

Where the asynchronous GRPO trainer lives depends on the installed TRL: 1.16 has it under
`trl.experimental.async_grpo`, 1.18 made it stable and exports it from `trl`. `places`
orders the two by the installed version (the other is tried too); everything else used
of it (its config, `RolloutSample`, the collator, the packed tree attention's kernels) is
found from the trainer class itself, so a newer layout needs no other change here.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

EXPERIMENTAL = "trl.experimental.async_grpo"
STABLE = "trl"
STABLE_SINCE = (1, 18)  # TRL moved the async trainer out of `experimental`
OLDEST = (1, 16)  # the first TRL with an async GRPO trainer harnessrl can drive


# ------------------------------------------------------------------ where the trainer is
def trl_version() -> tuple[int, ...]:
    """The installed TRL's release as numbers (`1.16.0` -> (1, 16, 0))."""
    text = importlib.metadata.version("trl")
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])


def places(version: tuple[int, ...]) -> tuple[str, ...]:
    """Where to look for the async trainer in TRL `version`, its own place first."""
    return (STABLE, EXPERIMENTAL) if version >= STABLE_SINCE else (EXPERIMENTAL, STABLE)


@dataclass(frozen=True)
class AsyncTRL:
    trainer: Any  # AsyncGRPOTrainer
    config: Any  # AsyncGRPOConfig
    rollout_sample: Any  # RolloutSample
    trainer_module: ModuleType  # where the trainer looks up its globals
    packing: ModuleType  # the packed tree attention's kernels


@functools.cache
def async_trl() -> AsyncTRL:
    """TRL's asynchronous GRPO, from the place the installed version keeps it."""
    return find_async_trl(places(trl_version()))


def find_async_trl(where: tuple[str, ...]) -> AsyncTRL:
    tried = []
    for place in where:
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
                      + "; ".join(tried) + "); harnessrl needs TRL >= "
                      + ".".join(map(str, OLDEST)))


# ------------------------------------------------------------------ the names relied on
Kind = Literal["attribute", "instance attribute", "parameter"]


@dataclass(frozen=True)
class Private:
    """One name of TRL's or transformers' that is not their public API, and why we use it.
    `owner` is a key of `OWNERS`; a parameter is `function(param)`."""

    owner: str
    name: str
    kind: Kind
    why: str


def _transformers_trainer() -> Any:
    from transformers import Trainer

    return Trainer


def _grpo_trainer() -> Any:
    from trl import GRPOTrainer

    return GRPOTrainer


OWNERS: dict[str, Callable[[], Any]] = {
    "transformers.Trainer": _transformers_trainer,
    "trl.GRPOTrainer": _grpo_trainer,
    "AsyncGRPOTrainer": lambda: async_trl().trainer,
    "async trainer module": lambda: async_trl().trainer_module,
    "async packing module": lambda: async_trl().packing,
}

PRIVATE: tuple[Private, ...] = (
    Private("transformers.Trainer", "_save_optimizer_and_scheduler", "attribute",
            "checkpoint: the optimizer and LR scheduler, written into our staged directory"),
    Private("transformers.Trainer", "_save_scaler", "attribute", "checkpoint: the AMP scaler"),
    Private("transformers.Trainer", "_save_rng_state", "attribute", "checkpoint: RNG states"),
    Private("transformers.Trainer", "_save_checkpoint", "attribute",
            "overridden: our atomic checkpoints at the trainer's save points"),
    Private("transformers.Trainer", "save_model(_internal_call)", "parameter",
            "saves the model without the hub push a user call would make"),
    Private("trl.GRPOTrainer", "_metrics", "instance attribute",
            "the sync trainer's metric sink (steps without a gradient)"),
    Private("AsyncGRPOTrainer", "_sync_weight", "attribute",
            "overridden: the schedule is told when a weight sync starts"),
    Private("AsyncGRPOTrainer", "_metrics", "instance attribute",
            "the async trainer's metric sink (our per-step figures, LoRA's)"),
    Private("AsyncGRPOTrainer", "_rollout_dataset", "instance attribute",
            "TRL's step metrics read the rollout wait from it (our GroupQueue)"),
    Private("AsyncGRPOTrainer", "_trained_groups", "instance attribute",
            "the collator records the groups trained in it"),
    Private("async trainer module", "DataCollatorForRollout", "attribute",
            "collates our whole-group batches as TRL's own"),
    Private("async trainer module",
            "DataCollatorForRollout(groups_trained, metrics, token_budget)", "parameter",
            "the collator's keywords we pass"),
    Private("async trainer module", "get_peak_flops_per_device", "attribute",
            "replaced on a CPU: its MFU probe asks CUDA for the device"),
    Private("async trainer module", "RolloutSample", "attribute", "the rows we queue"),
    Private("async packing module", "_flash_attn", "attribute",
            "replaced on a CPU: the tree attention's kernel (fetched from a hub)"),
    Private("async packing module", "TreeRow", "attribute",
            "prices and packs a step's rows over the processes"),
)


def _assigned_in_init(cls: type, name: str) -> bool:
    """Whether some `__init__` in `cls`'s MRO assigns `self.<name>`."""
    pattern = re.compile(rf"self\.{re.escape(name)}\s*(:[^=\n]*)?=")
    for klass in inspect.getmro(cls):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            if pattern.search(inspect.getsource(init)):
                return True
        except (OSError, TypeError):
            continue
    return False


def _has(owner: Any, item: Private) -> bool:
    if item.kind == "attribute":
        return hasattr(owner, item.name)
    if item.kind == "instance attribute":
        return hasattr(owner, item.name) or _assigned_in_init(owner, item.name)
    function, _, params = item.name.partition("(")
    target = getattr(owner, function, None)
    if target is None:
        return False
    wanted = [p.strip() for p in params.rstrip(")").split(",")]
    return set(wanted) <= set(inspect.signature(target).parameters)


def missing(items: tuple[Private, ...] = PRIVATE,
            owners: dict[str, Callable[[], Any]] | None = None) -> list[str]:
    """Every private name in `items` the installed TRL and transformers lack, each said
    with its owner and what harnessrl uses it for ([] when all are there)."""
    owners = OWNERS if owners is None else owners
    found: dict[str, Any] = {}
    out = []
    for item in items:
        if item.owner not in found:
            found[item.owner] = owners[item.owner]()
        if not _has(found[item.owner], item):
            out.append(f"{item.owner}.{item.name} ({item.kind}): {item.why}")
    return out


# ------------------------------------------------------------------ checkpoints
def save_trainer_files(trainer: Any, out: str) -> None:
    """What the Trainer's own checkpoint holds, written into `out`: the model (config,
    tokenizer, chat template), the optimizer and scheduler, the scaler, the RNG states."""
    trainer.store_flos()
    trainer.save_model(out, _internal_call=True)
    trainer._save_optimizer_and_scheduler(out)
    trainer._save_scaler(out)
    trainer._save_rng_state(out)


def save_model(trainer: Any, out: str) -> None:
    """The model alone, as the Trainer saves it inside a checkpoint."""
    trainer.save_model(out, _internal_call=True)


def with_checkpoint_saver(base: type, saver: Callable[[Any], None]) -> type:
    """A subclass of the trainer `base` whose checkpoints are `saver(trainer)`'s, at the
    Trainer's own save points."""

    class CheckpointingTrainer(base):  # type: ignore[misc, valid-type]
        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            saver(self)

    return CheckpointingTrainer


# ------------------------------------------------------------------ the async trainer
def with_sync_hook(base: type, before: Callable[[], None]) -> type:
    """A subclass of the async trainer `base` that calls `before()` as each weight sync
    starts."""

    class SyncHooked(base):  # type: ignore[misc, valid-type]
        def _sync_weight(self) -> None:
            before()
            super()._sync_weight()

    return SyncHooked


def metrics_sink(trainer: Any) -> Any:
    """The trainer's train metrics (name -> values of this step), which it reduces and
    logs at each step like its own."""
    return trainer._metrics["train"]


def set_rollout_dataset(trainer: Any, dataset: Any) -> None:
    """The dataset whose `wait_s` TRL's step metrics read (`perf/rollout_wait_s`)."""
    trainer._rollout_dataset = dataset


def rollout_collator(trainer: Any, num_processes: int, metrics: Any) -> Any:
    """TRL's collator of the async trainer's batches, recording into the trainer's trained
    groups and `metrics`."""
    return async_trl().trainer_module.DataCollatorForRollout(
        trainer.processing_class.pad_token_id, num_processes,
        groups_trained=trainer._trained_groups, metrics=metrics, token_budget=0)


def tree_row() -> Any:
    """TRL's packed row (its `load` prices a process's share of a step)."""
    return async_trl().packing.TreeRow()


def install_cpu_kernels(varlen_attention: Callable[..., Any]) -> None:
    """The async trainer without CUDA: the tree attention's flash kernel is
    `varlen_attention`, and the MFU probe (which asks CUDA for the device) reports none.
    Both are looked up as module globals when called, so replacing them is enough."""

    class _Kernels:
        flash_attn_varlen_func = staticmethod(varlen_attention)

    trl = async_trl()
    setattr(trl.packing, "_flash_attn", lambda: _Kernels)  # noqa: B010
    setattr(trl.trainer_module, "get_peak_flops_per_device",  # noqa: B010
            lambda _accelerator, _dtype: None)
