"""`harnessrl report`: chains per rollout and harness, the extension rate and why chains
broke."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = ("chains per rollout and harness: extension rate and why chains broke; the drift "
        "atlas (causes, call kinds) per harness and model family")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path)
    p.add_argument("--json", type=Path, help="also write the drift atlas here, as JSON")
    p.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    from rich.console import Console

    from harnessrl.reports import render_atlas, render_report
    from harnessrl.rollout.analysis.atlas import atlas, atlas_dict
    from harnessrl.rollout.analysis.chains import report
    from harnessrl.store.reader import TraceReader

    if not (args.run_dir / "trace.db").is_file():
        print(f"harnessrl: no trace store in {args.run_dir}", file=sys.stderr)
        return 2
    with TraceReader(args.run_dir) as store:
        console = Console()
        console.print(render_report(report(store)))
        found = atlas(store)
        console.print(render_atlas(found))
        if args.json:
            import json

            args.json.write_text(json.dumps(atlas_dict(found), indent=1) + "\n")
    return 0
