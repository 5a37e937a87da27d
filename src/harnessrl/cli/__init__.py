"""The one command line: `harnessrl serve | run | eval | train | export | report | ui |
demo | harness list|install|doctor | conformance | tasks check|list|split`.

One module per command, each adding its own subparser and a thin handler; flags are read
there and passed down as plain values. `build_parser()` is the whole parser (the docs'
CLI reference is generated from it).
"""

from __future__ import annotations

import argparse

from harnessrl.cli import (
    conformance,
    demo,
    eval,
    export,
    harness,
    report,
    run,
    serve,
    tasks,
    train,
    ui,
)

DESCRIPTION = ("The one command line: `harnessrl serve | run | eval | train | export | report "
               "| ui | demo | harness list|install|doctor | conformance | tasks check|list|split`.")
# The commands in the order `harnessrl --help` lists them.
COMMANDS = (serve, export, train, harness, conformance, tasks, run, eval, report, ui,
            demo)


def build_parser() -> argparse.ArgumentParser:
    """The full `harnessrl` parser: every command with its flags, defaults and help."""
    parser = argparse.ArgumentParser(prog="harnessrl", description=DESCRIPTION)
    sub = parser.add_subparsers()
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        return 130
