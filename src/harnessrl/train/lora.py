"""LoRA as a training option of the async trainer (`[lora]` in the config).

The policy is the base model with a PEFT LoRA adapter on the named linear layers
(`target_modules`, rank `rank`, scale `alpha / rank`); only the adapter trains, so the
optimizer state and a checkpoint hold the adapter's tensors alone.

**Weight sync: merged weights.** TRL's `AsyncGRPOTrainer` folds the adapter into the base
weights (`merge_adapter`) before every sync and unfolds it after, and harnessrl's file
transfer (`async_grpo.transfer.FileMover`) hands vLLM the merged model to reload, the same path
as full fine-tuning. That is what every vLLM harnessrl drives supports (dev mode's
`reload_weights`). The other way, vLLM's own LoRA loading (`--enable-lora`,
`/v1/load_lora_adapter` with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`), moves ~1% of the bytes
but serves the adapter under a model name of its own per version (`trl-policy-v<n>`):
every call the proxy forwards would have to name it, and the weight version each turn
records would come from that name instead of vLLM's `/weight_info`. TRL takes that path
only when it owns the transfer, which harnessrl never lets it (the proxies' gates and the
version stamps live in `VersionedTransfer`), so it is not used here; the run says so at
start and in every step's metrics (`lora/merged_sync` 1).

**Checkpoints** hold the adapter (`adapter_model.safetensors`, `adapter_config.json`) and
its optimizer state; TRL's `Trainer` loads both back on `--resume` (`load_adapter` on the
PEFT model). A checkpoint is therefore not a servable model by itself: **RUN_DIR/model/**
is the merged model (base + adapter, plain `model.safetensors`), written from the live
trainer at each checkpoint and at the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec

# Llama/Qwen/SmolLM2 names of the attention and MLP projections: every linear layer but
# the head. TRL's async trainer refuses an adapter on lm_head (its fused log-prob head
# reads the bare weight).
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
REFUSED_TARGETS = ("lm_head", "embed_tokens")
SYNC = "merged"  # what the weight sync sends (see the module docstring)


class LoraSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """`[lora]`: train a LoRA adapter instead of every weight (async trainer only; the
    table absent: full fine-tuning). Guide: docs/guides/async-grpo.md, LoRA."""

    rank: Annotated[int, msgspec.Meta(ge=1)] = 16  # r: the adapter's inner dimension
    alpha: Annotated[int, msgspec.Meta(ge=1)] = 32  # the update is scaled alpha / rank
    dropout: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.0  # on the adapter's input
    # the linear layers that get an adapter (module names; not lm_head or embed_tokens)
    target_modules: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_TARGETS))

    def __post_init__(self) -> None:
        if not self.target_modules:
            raise ValueError("lora.target_modules: name at least one module (e.g. q_proj)")
        if refused := sorted(set(self.target_modules) & set(REFUSED_TARGETS)):
            raise ValueError(f"lora.target_modules: {refused}: TRL's async trainer trains no "
                             "adapter on the head or the embeddings")


def check_lora(lora: LoraSettings | None, trainer: str, weight_transfer: str) -> None:
    """What `[lora]` is built for: the async trainer with the file transfer."""
    if lora is None:
        return
    if trainer != "async":
        raise ValueError('[lora]: LoRA is built for grpo.trainer = "async" only')
    if weight_transfer != "file":
        raise ValueError('[lora] with grpo.weight_transfer = "trl": not built (TRL would pick '
                         'its own adapter sync, which bypasses the proxies\' gates); use "file"')


def peft_config(lora: LoraSettings) -> Any:
    """PEFT's `LoraConfig` for the settings: a causal LM, no bias trained (a LoRA adapter
    holds no bias; merged or not, the base's biases stay as they are)."""
    from peft import LoraConfig

    return LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=list(lora.target_modules), bias="none",
                      task_type="CAUSAL_LM")


def trainer_kwargs(lora: LoraSettings | None) -> dict[str, Any]:
    """What TRL's trainer takes to train the adapter (nothing for full fine-tuning)."""
    return {} if lora is None else {"peft_config": peft_config(lora)}


def is_lora(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # no peft installed: no run can have trained an adapter
        return False
    return isinstance(model, PeftModel)


def trainable(model: Any) -> tuple[int, int]:
    """(trainable parameters, all parameters)."""
    params = list(model.parameters())
    return (sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params))


def describe(lora: LoraSettings, model: Any) -> str:
    """The line a run prints at start: what trains and what the sync sends."""
    train, total = trainable(model)
    return (f"LoRA rank {lora.rank}, alpha {lora.alpha}, dropout {lora.dropout:g} on "
            f"{', '.join(lora.target_modules)}: {train:,} of {total:,} parameters train "
            f"({train / total:.2%}); weight sync: merged weights (the adapter folded into "
            "the base, vLLM reloads the model; adapter loading is not used)")


def merged_state(model: Any) -> dict[str, Any]:
    """The base model's tensors under their own names with the adapter folded in, copied
    (the caller unmerges after). The model must be merged (`merge_adapter`)."""
    state = {}
    for name, tensor in model.get_base_model().state_dict().items():
        if ".lora_" in name:
            continue
        state[name.replace(".base_layer", "")] = tensor.detach().to("cpu").clone()
    return state


def save_merged(trainer: Any, dest: Path) -> None:
    """A servable model at `dest`: config, merged weights (one `model.safetensors`),
    generation config and tokenizer; the trainer's adapter is unmerged after."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    import torch

    # merge then unmerge adds and subtracts the update in floating point: the base comes
    # back off by a rounding, so its exact tensors are put back after
    bases = {n: p.detach().clone() for n, p in model.named_parameters() if ".base_layer." in n}
    model.merge_adapter()
    try:
        state = merged_state(model)
    finally:
        model.unmerge_adapter()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name in bases:
                    p.copy_(bases[name])
    base = model.get_base_model()
    dest.mkdir(parents=True, exist_ok=True)
    base.save_pretrained(str(dest), state_dict=state, safe_serialization=True)
    if trainer.processing_class is not None:
        trainer.processing_class.save_pretrained(str(dest))


def attach_metrics(trainer: Any, lora: LoraSettings) -> None:
    callback = metrics_callback(lora)
    callback.trainer = trainer
    trainer.add_callback(callback)


def metrics_callback(lora: LoraSettings) -> Any:
    """Every step's metrics say what the sync sent (`lora/merged_sync` 1: merged weights)
    and how many parameters trained; they reach metrics.jsonl's `trl` figures and TRL's
    `report_to` beside TRL's own `perf/weight_sync_s`."""
    from transformers import TrainerCallback

    from harnessrl.train.trl_compat import metrics_sink

    class LoraMetrics(TrainerCallback):
        trainer: Any = None

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None,
                        **_: Any) -> None:
            if self.trainer is None or model is None:
                return
            train, total = trainable(model)
            metrics = metrics_sink(self.trainer)
            metrics["lora/merged_sync"].append(1.0 if SYNC == "merged" else 0.0)
            metrics["lora/rank"].append(float(lora.rank))
            metrics["lora/trainable_params"].append(float(train))
            metrics["lora/trainable_share"].append((float(train), float(total)))

    return LoraMetrics()
