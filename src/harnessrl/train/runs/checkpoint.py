"""Checkpoints of a training run, written so that a crash never leaves one that looks whole,
and what `harnessrl train --resume` needs to go on from one.

A checkpoint is a directory `checkpoint-<step>` under `[checkpoint] dir` (default
RUN_DIR/checkpoints) holding what TRL's trainer saves and loads itself (the model, its
config and generation config, the tokenizer with its chat template, `optimizer.pt`,
`scheduler.pt`, the RNG states, `trainer_state.json` with the step) and harnessrl's own
`harnessrl_state.json`: the weight version vLLM served, the task order's cursor, and the
run's fingerprint (what a resumed run must not change).

**Atomic.** Everything is written into `.checkpoint-<step>.partial`, every file is fsynced,
then `COMPLETE.json` (each file's size and sha256) is written last and the directory is
renamed into place. A directory without that marker, or whose files do not match it, is
never taken: `--resume latest` skips it, `--resume PATH` refuses it naming the file.

The checkpoint directory is also a servable model (`vllm serve DIR`; the training-state
files beside the weights are ignored); RUN_DIR/model/ holds only the model files of the
newest one (hard links, no second copy), and of the final weights at the end of a run.
A LoRA run's checkpoint holds the adapter instead (train/lora.py); its RUN_DIR/model/ is
the merged model, written from the trainer.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from harnessrl.train import lora, trl_compat
from harnessrl.train.config import TrainSettings

PREFIX = "checkpoint-"
MARKER = "COMPLETE.json"
STATE = "harnessrl_state.json"
MODEL_DIR = "model"
# What a checkpoint holds beyond the model: left out of RUN_DIR/model/.
TRAINING_STATE_FILES = frozenset({
    "optimizer.pt", "scheduler.pt", "scaler.pt", "trainer_state.json", "training_args.bin",
    STATE, MARKER})
_TRAINING_STATE_PREFIXES = ("rng_state",)


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message names the file."""


# ------------------------------------------------------------------ the run's fingerprint
def fingerprint(config: TrainSettings, task_ids: Sequence[str]) -> dict[str, Any]:
    """What a resumed run must share with the one that wrote the checkpoint: the model,
    the harnesses, the task set (its spec and its ids), the group size and the seed that
    orders the tasks. Changing anything else (learning rate, steps, eval) is allowed."""
    digest = hashlib.sha256("\n".join(sorted(task_ids)).encode()).hexdigest()[:16]
    return {"model.path": config.model.path, "rollout.harnesses": list(config.rollout.harnesses),
            "rollout.tasks": config.rollout.tasks, "task ids": f"{len(task_ids)} ({digest})",
            "grpo.num_generations": config.grpo.num_generations, "grpo.seed": config.grpo.seed,
            "rollout.mix": config.rollout.mix,
            # a LoRA run's adapter fits only its own settings (absent: full fine-tuning)
            **({"lora": msgspec.to_builtins(config.lora)} if config.lora is not None else {})}


def differences(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    return [f"{key}: {saved.get(key)!r} in the checkpoint, {now.get(key)!r} now"
            for key in sorted(set(saved) | set(now)) if saved.get(key) != now.get(key)]


# ------------------------------------------------------------------ finding and checking
def checkpoint_root(config: TrainSettings) -> Path:
    return Path(config.checkpoint.dir) if config.checkpoint.dir else (
        Path(config.run_dir) / "checkpoints")


def step_of(path: Path) -> int | None:
    digits = path.name.removeprefix(PREFIX)
    return int(digits) if path.name.startswith(PREFIX) and digits.isdigit() else None


def complete(root: Path) -> list[Path]:
    """The checkpoints under `root` that carry their marker, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and step_of(p) is not None
             and (p / MARKER).is_file()]
    return sorted(found, key=lambda p: step_of(p) or 0)


def verify(path: Path) -> dict[str, Any]:
    """The checkpoint's harnessrl state, once every file matches its marker; else
    CheckpointError naming what is wrong and where."""
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    marker = path / MARKER
    if not marker.is_file():
        raise CheckpointError(f"{marker}: missing, so {path} is half-written (a crash while "
                              "it was saved) or not a harnessrl checkpoint")
    try:
        files = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{marker}: unreadable ({error})") from None
    for name, want in files.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file}: listed in {MARKER} but missing")
        if file.stat().st_size != want["size"] or _sha256(file) != want["sha256"]:
            raise CheckpointError(f"{file}: corrupt (its size or sha256 differs from the one "
                                  f"{MARKER} recorded when it was written)")
    try:
        return json.loads((path / STATE).read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path / STATE}: unreadable ({error})") from None


def resolve(spec: str, root: Path) -> Path:
    """`--resume latest` (the newest whole checkpoint under `root`) or `--resume PATH`."""
    if spec != "latest":
        return Path(spec)
    found = complete(root)
    if not found:
        partial = sorted(p.name for p in root.glob(f".{PREFIX}*")) if root.is_dir() else []
        more = f" (only half-written ones: {', '.join(partial)})" if partial else ""
        raise CheckpointError(f"--resume latest: no complete checkpoint in {root}{more}")
    return found[-1]


@dataclass(frozen=True)
class Resume:
    """A checked checkpoint to go on from."""

    path: Path
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.state["step"])


def prepare_resume(spec: str, config: TrainSettings, task_ids: Sequence[str]) -> Resume:
    """Refuses, before anything starts, a missing, half-written or corrupt checkpoint and a
    config changed in what matters; each reason names its file."""
    path = resolve(spec, checkpoint_root(config))
    state = verify(path)
    if changed := differences(state.get("fingerprint", {}), fingerprint(config, task_ids)):
        raise CheckpointError(f"{path / STATE}: this config differs from the run the "
                              f"checkpoint belongs to: {'; '.join(changed)}")
    return Resume(path, state)


# ------------------------------------------------------------------ writing
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _seal(directory: Path) -> None:
    """fsync every file, then write the marker (sizes, hashes) last, fsynced too."""
    files = {}
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        _fsync(file)
        files[str(file.relative_to(directory))] = {"size": file.stat().st_size,
                                                   "sha256": _sha256(file)}
    marker = directory / MARKER
    with marker.open("w") as f:
        json.dump({"files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync(directory)


def _replace_dir(staged: Path, final: Path) -> None:
    """Put `staged` at `final` by renames (the old one, if any, is removed after)."""
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.rename(final, old)
    os.rename(staged, final)
    _fsync(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def save(trainer: Any, root: Path, state: dict[str, Any], keep: int) -> Path:
    """A whole checkpoint of `trainer` at its step, with harnessrl's `state`, atomically;
    then only the newest `keep` whole ones are kept (and no half-written one)."""
    step = int(trainer.state.global_step)
    root.mkdir(parents=True, exist_ok=True)
    staged = root / f".{PREFIX}{step}.partial"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    out = str(staged)
    trl_compat.save_trainer_files(trainer, out)  # model, tokenizer, optimizer, RNG states
    trainer.state.save_to_json(str(staged / "trainer_state.json"))
    (staged / STATE).write_text(json.dumps({**state, "step": step}, indent=1))
    _seal(staged)
    final = root / f"{PREFIX}{step}"
    _replace_dir(staged, final)
    _rotate(root, keep)
    return final


def _rotate(root: Path, keep: int) -> None:
    for path in complete(root)[:-keep]:
        shutil.rmtree(path, ignore_errors=True)
    for partial in root.glob(f".{PREFIX}*"):
        shutil.rmtree(partial, ignore_errors=True)


def is_model_file(name: str) -> bool:
    return name not in TRAINING_STATE_FILES and not name.startswith(_TRAINING_STATE_PREFIXES)


def publish_model(source: Path, run_dir: Path) -> Path:
    """RUN_DIR/model/: the model files of `source` (a checkpoint or a saved model), hard
    linked where the filesystem allows, swapped in whole."""
    final = run_dir / MODEL_DIR
    staged = run_dir / f".{MODEL_DIR}.partial"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    for file in source.iterdir():
        if file.is_file() and is_model_file(file.name):
            try:
                os.link(file, staged / file.name)
            except OSError:
                shutil.copy2(file, staged / file.name)
    _replace_dir(staged, final)
    return final


def publish_checkpoint(trainer: Any, path: Path, run_dir: Path) -> Path:
    """RUN_DIR/model/ after checkpoint `path`: its model files, or, for a LoRA run (whose
    checkpoint holds the adapter only), the merged model from the trainer."""
    if lora.is_lora(trainer.accelerator.unwrap_model(trainer.model)):
        return save_final_model(trainer, run_dir)
    return publish_model(path, run_dir)


def save_final_model(trainer: Any, run_dir: Path) -> Path:
    """The trained weights at the end of a run, as RUN_DIR/model/ (a LoRA run's merged
    into the base: a plain model vLLM serves)."""
    staged = run_dir / f".{MODEL_DIR}.final"
    shutil.rmtree(staged, ignore_errors=True)
    if lora.is_lora(trainer.accelerator.unwrap_model(trainer.model)):
        lora.save_merged(trainer, staged)
    else:
        trl_compat.save_model(trainer, str(staged))
    try:
        return publish_model(staged, run_dir)
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def model_dir_of(path: Path) -> Path:
    """What `harnessrl eval --model` serves for PATH: a checkpoint (refused unless whole)
    or a model directory, as it is."""
    if step_of(path) is not None or (path / MARKER).exists():
        verify(path)
    if not (path / "config.json").is_file():
        if (path / "adapter_config.json").is_file():
            raise CheckpointError(f"{path}: a LoRA adapter, not a model; the run's merged "
                                  "model is RUN_DIR/model")
        raise CheckpointError(f"{path / 'config.json'}: missing; not a model directory or "
                              "checkpoint")
    return path

