"""The one command line: `harnessrl serve | run | eval | train | export | report | ui |
demo | harness list|install|doctor | conformance | tasks check|list|split | sandboxes`.

One module per command: its `HELP`, `add_arguments` (flags of settings fields declared
through the settings layer, harnessrl/settings.py) and a thin handler. `build_parser()` is
the whole parser (the docs' CLI reference is generated from it).
"""

from __future__ import annotations

import argparse
from collections.abc import Collection

from harnessrl.cli import (
    conformance,
    demo,
    eval,
    export,
    harness,
    report,
    run,
    sandboxes,
    serve,
    tasks,
    train,
    ui,
)

DESCRIPTION = ("The one command line: `harnessrl serve | run | eval | train | export | report "
               "| ui | demo | harness list|install|doctor | conformance | tasks check|list|split | "
               "sandboxes`.")
# The commands in the order `harnessrl --help` lists them.
COMMANDS = {"serve": serve, "export": export, "train": train, "harness": harness,
            "conformance": conformance, "tasks": tasks, "run": run, "eval": eval,
            "report": report, "ui": ui, "demo": demo, "sandboxes": sandboxes}


def build_parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The full `harnessrl` parser: every command with its flags, defaults and help.
    `commands`: declare only these commands' flags (the others keep their name and help),
    so a command does not import the settings types of every other."""
    parser = argparse.ArgumentParser(prog="harnessrl", description=DESCRIPTION)
    sub = parser.add_subparsers()
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.HELP)
        if commands is None or name in commands:
            command.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    import sys

    from harnessrl.errors import CommandError

    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[:1])
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        return 130
    except CommandError as error:  # a model that cannot load, an engine that died: one line
        print(f"harnessrl: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
