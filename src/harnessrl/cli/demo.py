"""`harnessrl demo`: the embedded default, end to end on this machine."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = ("the embedded default: SmolLM2 on vLLM, mini-swe-agent on bundled tasks through "
        "the proxy, two GRPO steps")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", type=Path, default=Path("runs/demo"))
    p.add_argument("--model", help="tiny or smollm2 (built here), a model directory, a "
                                   "training run's directory or one of its checkpoints, or "
                                   "a hub id (default: smollm2, SmolLM2-135M-Instruct)")
    p.set_defaults(func=demo)


def demo(args: argparse.Namespace) -> int:
    from harnessrl.demo import run_demo

    return run_demo(args.run_dir, model=args.model)
