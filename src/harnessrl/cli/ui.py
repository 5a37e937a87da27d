"""`harnessrl ui`: the trace viewer, a web page over runs, rollouts and tokens."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harnessrl.cli.common import DEFAULT_RUN_DIR, is_loopback

HELP = "the trace viewer: a web page over runs, rollouts and tokens"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, nargs="?", default=DEFAULT_RUN_DIR.parent,
                   help="a run directory, or a directory of them (default: runs)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8200)
    p.add_argument("--tokenizer", help="tokenizer (model dir or hub id) to show ids as text "
                                       "(default: the run's model, if a local directory)")
    p.set_defaults(func=run_ui)


def run_ui(args: argparse.Namespace) -> int:
    from harnessrl.ui.app import serve

    if not is_loopback(args.host):
        print(f"harnessrl: the viewer shows every trace to anyone who can reach "
              f"{args.host}:{args.port}", file=sys.stderr)
    serve(args.run_dir, host=args.host, port=args.port, tokenizer=args.tokenizer)
    return 0
