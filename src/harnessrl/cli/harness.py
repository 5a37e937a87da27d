"""`harnessrl harness list|install|doctor`: the real harnesses (doctor is `conformance` for
the named ones)."""

from __future__ import annotations

import argparse

from harnessrl.cli.common import harnesses
from harnessrl.cli.conformance import run_conformance
from harnessrl.settings import add_flags

HELP = "the real harnesses: list, install, doctor"


def add_arguments(harness: argparse.ArgumentParser) -> None:
    from harnessrl.rollout.runner import RolloutSettings

    actions = harness.add_subparsers()
    listing = actions.add_parser("list", help="known harnesses and whether installed")
    listing.set_defaults(func=harness_list)
    install = actions.add_parser("install", help="install pinned harnesses (all if none)")
    install.add_argument("names", nargs="*")
    install.set_defaults(func=harness_install)
    doctor = actions.add_parser("doctor", help="run one harness against the proxy and say "
                                               "what works")
    doctor.add_argument("names", nargs="+")
    doctor.set_defaults(func=run_conformance, markdown=None, mode="chat,token")
    for p in (listing, install, doctor):
        add_flags(p, RolloutSettings, "tools_dir")


def harness_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from harnessrl.harnesses import variants_of

    table = Table("harness", "version", "dialects", "from", "runtime", "streams",
                  "installed")
    for h in harnesses([]):
        # the harness's own dialect first, then each variant's (`name@variant`)
        dialects = ", ".join(v.dialect for v in variants_of(h.name))
        runtime = h.runtime or ("node (PATH)" if h.registry == "npm" and not h.entry
                                else "none" if h.entry else f"python {h.python}")
        table.add_row(h.name, h.version, dialects, h.registry, runtime,
                      "yes" if h.streams else "no",
                      "yes" if h.installed(args.tools_dir) else "no")
    Console().print(table)
    return 0


def harness_install(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    for h in harnesses(args.names):
        with console.status(f"installing {h.name} {h.version}"):
            h.install(args.tools_dir, log=lambda line: console.log(line))
        console.print(f"[green]ok[/] {h.name} {h.version} -> {h.executable(args.tools_dir)}")
    return 0
