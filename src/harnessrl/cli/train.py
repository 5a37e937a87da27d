"""`harnessrl train`: GRPO on real harness rollouts, from one config file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "GRPO on real harness rollouts, from one config file"


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
    from harnessrl.train.checkpoint import CheckpointError
    from harnessrl.train.loop import train

    try:
        train(config, resume=args.resume)
    except CheckpointError as exc:  # refused before anything started
        print(f"harnessrl: {exc}", file=sys.stderr)
        return 2
    return 0
