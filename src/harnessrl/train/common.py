"""What both trainers (the synchronous `loop` and the asynchronous `async_loop`) share, so
that neither imports the other for it."""

from __future__ import annotations

from typing import Any

from harnessrl.train.config import TrainSettings
from harnessrl.types import Sampling


def sampling_of(config: TrainSettings) -> Sampling:
    """What every call is sampled with, overriding the harness (see EngineSettings)."""
    from harnessrl.train.trl import on_policy_sampling

    e = config.engine
    if not e.on_policy:
        return Sampling(max_tokens=e.max_tokens, temperature=e.temperature)
    return on_policy_sampling(e.temperature, e.max_tokens)


def quiet(trainer: Any) -> None:
    """Our step lines and progress replace the trainer's printed log dicts and tqdm bar."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
