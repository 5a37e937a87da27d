"""`harnessrl sandboxes [--remove]`: the sandboxes on this machine and their owners; what
runners that died (SIGKILL, a lost node) left behind, removed on demand. Every runner start
sweeps the same leftovers (rollout/sandbox/owners.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harnessrl.rollout.sandbox.owners import Entry

HELP = ("the sandboxes (local and Docker) on this machine, whose runner is gone; --remove "
        "removes those")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--remove", action="store_true",
                   help="remove what dead runners left: their processes, containers and "
                        "sandbox directories")
    p.add_argument("--json", action="store_true", help="one JSON object per sandbox")
    p.set_defaults(func=sandboxes)


def sandboxes(args: argparse.Namespace) -> int:
    from harnessrl.rollout.sandbox import owners

    listed = owners.entries()
    removed = {e.token for e in owners.sweep()} if args.remove else set()
    for entry in listed:
        state = _state(entry, removed)
        if args.json:
            print(json.dumps({"token": entry.token, "owner": entry.pid, "state": state,
                              "directory": entry.directory, "container": entry.container,
                              "processes": len(owners.marked(entry.token))}))
            continue
        age = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.created))
        box = f"container {entry.container}" if entry.container else "local"
        print(f"{state:<9} pid {entry.pid:<8} {age}  {box:<24} {entry.directory}")
    dead = [e for e in listed if e.left_over() and e.token not in removed]
    # containers no entry names (a runner of an older harnessrl, an entry removed by hand)
    registered = {e.container for e in listed}
    stray = [(name, label) for name, label in owners.dead_containers()
             if name not in registered]
    if args.remove:
        owners.remove_containers([name for name, _label in stray])
    for name, label in stray:
        state = "removed" if args.remove else "left-over"
        if args.json:
            print(json.dumps({"container": name, "owner": label, "state": state}))
        else:
            print(f"{state:<9} owner {label}  container {name}")
    if args.json:
        return 0
    if not listed and not stray:
        print("no sandboxes", file=sys.stderr)
    elif (left := len(dead) + (0 if args.remove else len(stray))) > 0:
        print(f"{left} left over by runners that are gone: `harnessrl sandboxes --remove` "
              "removes them", file=sys.stderr)
    return 0


def _state(entry: Entry, removed: set[str]) -> str:
    if entry.token in removed:
        return "removed"
    if not entry.here():
        return "elsewhere"  # another boot or PID namespace: its owner cannot be judged
    return "left-over" if entry.left_over() else "running"
