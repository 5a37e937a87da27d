"""One way to name a model, for every command that takes one (`serve`, `run`, `eval`,
`train`, `demo`): what vLLM and the trainer load for a name.

* `tiny` and `smollm2`: the built-in models (harnessrl/models), built or prepared here
  and cached;
* a directory: a model directory, a training run's directory (its `model/`), or one of
  its checkpoints (refused unless whole);
* anything else: a Hugging Face hub id, which vLLM loads from the local Hugging Face cache
  or fetches. With the hub switched off (HF_HUB_OFFLINE) an id that is not in the cache
  is refused here, before any vLLM is started.

A name that cannot be loaded is a `ModelUnavailable` saying what was asked and why.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnessrl.errors import ModelUnavailable
from harnessrl.train.runs.checkpoint import MODEL_DIR, CheckpointError, model_dir_of

Status = Callable[[str], contextlib.AbstractContextManager[Any]]
TINY_DIR = Path("~/.cache/harnessrl/models/tiny-qwen2")
FORMS = ("tiny or smollm2 (built here), a model directory, a training run's directory or "
         "one of its checkpoints, or a Hugging Face hub id")


def _tiny(_status: Status | None) -> Path:
    from harnessrl.models.tiny import build_tiny_model

    return build_tiny_model(TINY_DIR.expanduser())


def _smollm2(status: Status | None) -> Path:
    from harnessrl.models.smollm2 import prepare_smollm2

    if status is None:
        return prepare_smollm2()
    with status("preparing SmolLM2-135M-Instruct (first run: ~1 min)") as shown:
        update = getattr(shown, "update", None)  # a rich Status shows each step

        def progress(message: str) -> None:
            if callable(update):
                update(message)

        return prepare_smollm2(progress=progress)


BUILT_IN: dict[str, Callable[[Status | None], Path]] = {"tiny": _tiny, "smollm2": _smollm2}


def resolve_model(name: str, *, status: Status | None = None) -> str:
    """The path (or hub id) to load for `name`; `status` shows a long preparation."""
    if name in BUILT_IN:
        try:
            return str(BUILT_IN[name](status))
        except (OSError, RuntimeError) as error:
            raise ModelUnavailable(f"model {name!r}: the built-in model could not be "
                                   f"prepared: {_line(error)}") from None
    path = Path(name).expanduser()
    if path.is_dir():
        return str(_model_dir(name, path))
    if _looks_like_path(name):
        raise ModelUnavailable(f"model {name!r}: no such directory")
    if _hub_offline() and not _cached(name):
        raise ModelUnavailable(
            f"model {name!r}: not built-in (tiny, smollm2), not a directory, and not in "
            "the local Hugging Face cache with the hub switched off (HF_HUB_OFFLINE)")
    return name


def _model_dir(name: str, path: Path) -> Path:
    """A model directory, a run's model/ or a whole checkpoint."""
    if not (path / "config.json").is_file() and (path / MODEL_DIR / "config.json").is_file():
        path = path / MODEL_DIR
    try:
        return model_dir_of(path)
    except CheckpointError as error:
        raise ModelUnavailable(f"model {name!r}: {_line(error)}") from None


def _looks_like_path(name: str) -> bool:
    """A hub id is `name` or `org/name`; more slashes, or a leading `.`, `/` or `~`, is a
    path."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or name.endswith("/")


def _hub_offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _cached(repo: str) -> bool:
    """Whether the hub id's config.json is in the local Hugging Face cache."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo, "config.json"), str)
    except (ImportError, ValueError):  # not installed, or not a valid repo id
        return False


def _line(error: BaseException) -> str:
    return " ".join(str(error).split())
