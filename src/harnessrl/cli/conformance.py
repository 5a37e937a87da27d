"""`harnessrl conformance` (and `harness doctor`): every harness writes a file through the
proxy; the matrix of what works."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from harnessrl.cli.common import harnesses
from harnessrl.settings import add_flags

if TYPE_CHECKING:
    from rich.console import Console

    from harnessrl.rollout.conformance import Result

HELP = "every harness writes a file through the proxy; print the matrix"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from harnessrl.rollout.runner import RolloutSettings

    p.add_argument("names", nargs="*")
    add_flags(p, RolloutSettings, "tools_dir")
    p.add_argument("--markdown", type=Path, help="also write the matrix here")
    p.add_argument("--drift", type=Path, nargs="?", const=True, default=None,
                   help="also print the drift atlas (breaks by cause, calls by kind) of "
                        "every variant and mode; with a path, write it there as markdown")
    p.add_argument("--mode", default="chat,token",
                   help="chat (the scripted chat engine), token (the proxy's token mode "
                        "against a scripted completions server), or both, comma-separated")
    p.set_defaults(func=run_conformance)


def run_conformance(args: argparse.Namespace) -> int:
    import tempfile

    from rich.console import Console

    from harnessrl.harnesses import all_variants
    from harnessrl.rollout.conformance import (
        MODES,
        check,
        drift_markdown,
        install_timed,
        policy_tokenizer,
    )

    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        print(f"harnessrl: --mode takes {', '.join(MODES)} (comma-separated), not "
              f"{args.mode!r}", file=sys.stderr)
        return 2
    console = Console()
    tokenizer = policy_tokenizer()
    results = []
    # every harness and each of its dialect variants, unless names are given
    for h in harnesses(args.names) if args.names else all_variants():
        with console.status(f"{h.name}: installing (if not yet installed)"):
            install_seconds = install_timed(h, args.tools_dir)
        for mode in modes:
            with console.status(f"{h.name}: running headless ({mode} mode)"), \
                    tempfile.TemporaryDirectory(prefix=f"hrl-{h.slug}-") as root:
                result = asyncio.run(check(h, tokenizer=tokenizer, tools_dir=args.tools_dir,
                                           root=Path(root), mode=mode))
            result.install_seconds, install_seconds = install_seconds, None
            results.append(result)
            if isinstance(args.drift, Path):  # so far: a run cut short still has its rows
                args.drift.write_text(drift_markdown(results))
            mark = ("[green]PASS[/]" if result.passed
                    else f"[red]FAIL[/] {'; '.join(result.problems)}")
            console.print(f"{h.name} {h.version} ({mode} mode): {mark}")
            if not result.passed:
                console.print(result.output[-2000:], markup=False, highlight=False)
    _report(args, results, console)
    return 0 if all(r.passed for r in results) else 1


def _report(args: argparse.Namespace, results: list[Result], console: Console) -> None:
    """The matrix (and the drift table, with --drift) on the console and in their files."""
    from rich.markdown import Markdown

    from harnessrl.rollout.conformance import drift_markdown, matrix_markdown

    matrix = matrix_markdown(results)
    console.print(Markdown(matrix))
    if args.markdown:
        args.markdown.write_text(matrix)
    if args.drift is not None:
        drift = drift_markdown(results)
        console.print(Markdown(drift))
        if isinstance(args.drift, Path):
            args.drift.write_text(drift)
