"""`harnessrl train`: GRPO on real harness rollouts, from one config file."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

HELP = "GRPO on real harness rollouts, from one config file"
# Seconds between progress lines; a module constant so a short test run can shorten it.
PROGRESS_EVERY = 30.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, required=True, help="TOML or YAML (see "
                                                              "examples/train.toml)")
    p.add_argument("--run-dir", type=Path, help="overrides the config's run_dir")
    p.add_argument("--steps", type=int, help="overrides the config's grpo.steps")
    p.add_argument("--resume", nargs="?", const="latest", metavar="latest|PATH",
                   help="go on from a checkpoint: the newest whole one under the config's "
                        "[checkpoint] dir (latest, the default) or PATH (async trainer)")
    p.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    import msgspec

    from harnessrl.train.config import ConfigError, load_config

    try:
        config = load_config(args.config)
    except (ConfigError, OSError) as exc:
        print(f"harnessrl: {exc}", file=sys.stderr)
        return 2
    if args.run_dir is not None:
        config = msgspec.structs.replace(config, run_dir=str(args.run_dir))
    if args.steps is not None:
        config = msgspec.structs.replace(
            config, grpo=msgspec.structs.replace(config.grpo, steps=args.steps))
    from harnessrl.train.loop import train
    from harnessrl.train.runs.checkpoint import CheckpointError

    try:
        with _progress(Path(config.run_dir)) as live:
            train(config, resume=args.resume,
                  on_phase=live.set_phase if live is not None else None)
    except CheckpointError as exc:  # refused before anything started
        print(f"harnessrl: {exc}", file=sys.stderr)
        return 2
    return 0


def _progress(run_dir: Path) -> contextlib.AbstractContextManager[Any]:
    """A line every PROGRESS_EVERY seconds read from the run's store (rollouts, turns,
    tool calls, weight version): the async trainer can sample for minutes between its
    step lines, and a log that says nothing for that long looks hung. Only the first
    process of a multi-process trainer prints it. The line names no step number: a
    resumed run's steps go on from its checkpoint, which the trainer's step lines give."""
    if os.environ.get("RANK", "0") != "0":
        return contextlib.nullcontext()
    from rich.console import Console

    from harnessrl.train.live import Live

    return Live(run_dir, Console(), title="training", every=PROGRESS_EVERY)
