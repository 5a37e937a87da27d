"""`harnessrl tasks check|list|split|generate`: a task set as its author handles it (the
logic is in rollout/tasks/taskset.py and, for generated sets, rollout/tasks/tablegen.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from harnessrl.settings import add_flags

if TYPE_CHECKING:
    from harnessrl.rollout.tasks.task import Task

SET_HELP = "a task dir, a directory of tasks, a .jsonl file, or bundled[:...]"


HELP = "task sets: check, list, split, generate"


def add_arguments(tasks: argparse.ArgumentParser) -> None:
    from harnessrl.rollout.runner import RolloutSettings

    actions = tasks.add_subparsers()
    check = actions.add_parser(
        "check", help="every task's reference solution passes and an empty attempt fails, "
                      "in the chosen sandbox; exit 1 when one does not (for CI)")
    check.add_argument("tasks", help=SET_HELP)
    add_flags(check, RolloutSettings, "sandbox", "concurrency", "image", "build_network",
              "tools_dir", helps={"concurrency": "tasks checked at once",
                                  "image": "docker sandbox: this image for every task "
                                           "(default: each task's own)"})
    check.add_argument("--json", action="store_true", help="one JSON object per task")
    check.set_defaults(func=tasks_check)
    listing = actions.add_parser("list", help="the tasks of a set")
    listing.add_argument("tasks", help=SET_HELP)
    listing.add_argument("--json", action="store_true", help="one JSON object per task")
    listing.set_defaults(func=tasks_list)
    split = actions.add_parser("split", help="a seeded held-out split, written as two task "
                                             "sets: OUT/train and OUT/held_out")
    split.add_argument("tasks", help=SET_HELP)
    split.add_argument("--out", type=Path, required=True, help="a new directory")
    split.add_argument("--held-out", type=float, default=0.2,
                       help="the share of tasks held out (default 0.2)")
    split.add_argument("--seed", type=int, default=0)
    split.set_defaults(func=tasks_split)
    generate = actions.add_parser(
        "generate", help="a generated data-analysis task set (CSV tables and questions), "
                         "written as OUT/train and OUT/held_out in the Harbor layout")
    generate.add_argument("out", type=Path, help="a new directory")
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--train", type=int, default=1000, help="train tasks (1000)")
    generate.add_argument("--held-out", type=int, default=250, help="held-out tasks (250)")
    generate.add_argument("--tiers", default=None,
                          help="comma-separated tiers, in equal shares (default: all of "
                               "lookup,count,filter,sum,groupmax,join)")
    generate.set_defaults(func=tasks_generate)


def _load(spec: str) -> list[Task] | None:
    from rich.console import Console

    from harnessrl.rollout.tasks.task import TaskError, load_tasks

    try:
        return load_tasks(spec)
    except TaskError as error:
        Console(stderr=True).print(f"[bold red]error[/]: {error}", highlight=False)
        return None


def tasks_check(args: argparse.Namespace) -> int:
    import asyncio

    from rich.console import Console
    from rich.table import Table

    from harnessrl.rollout.sandbox import registry
    from harnessrl.rollout.tasks.taskset import check_exit_code, check_tasks

    if (tasks := _load(args.tasks)) is None:
        return 2
    console = Console()
    if (problem := registry.backend(args.sandbox).problem()) is not None:
        Console(stderr=True).print(f"[bold red]error[/]: the {args.sandbox} sandbox is not "
                                   f"available: {problem}", highlight=False)
        return 2
    with console.status(f"checking {len(tasks)} tasks in the {args.sandbox} sandbox"):
        rows = asyncio.run(check_tasks(tasks, sandbox=args.sandbox,
                                       concurrency=args.concurrency, image=args.image,
                                       build_network=args.build_network,
                                       tools=args.tools_dir))
    if args.json:
        for row in rows:
            print(json.dumps({"task": row.task, "ok": row.ok, "solution": row.solution,
                              "empty": row.empty, "problems": list(row.problems),
                              "seconds": round(row.seconds, 2)}))
        return check_exit_code(rows)
    table = Table("task", "solution", "empty attempt", "seconds", "what failed and why")
    for row in rows:
        table.add_row(row.task, _mark(row.solution, "passes"), _mark(row.empty, "fails"),
                      f"{row.seconds:.1f}", "\n".join(row.problems) or "[green]ok[/]")
    console.print(table)
    failed = sum(1 for row in rows if not row.ok)
    console.print(f"{len(rows) - failed} of {len(rows)} tasks pass the check"
                  + (f"; [bold red]{failed} fail[/]" if failed else ""))
    return check_exit_code(rows)


def _mark(value: str, good: str) -> str:
    return f"[green]{value}[/]" if value == good else f"[bold red]{value}[/]"


def tasks_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from harnessrl.rollout.tasks.taskset import describe

    if (tasks := _load(args.tasks)) is None:
        return 2
    rows = describe(tasks)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    table = Table("task", "difficulty", "tags", "environment", "solution")
    for row in rows:
        table.add_row(str(row["id"]), str(row["difficulty"] or "-"),
                      ", ".join(row["tags"]) or "-",  # type: ignore[arg-type]
                      str(row["environment"]), "yes" if row["solution"] else "no")
    Console().print(table)
    print(f"{len(rows)} tasks")
    return 0


def tasks_split(args: argparse.Namespace) -> int:
    from rich.console import Console

    from harnessrl.rollout.tasks.task import TaskError
    from harnessrl.rollout.tasks.taskset import split_task_set

    if (tasks := _load(args.tasks)) is None:
        return 2
    try:
        train, held_out = split_task_set(tasks, args.out, held_out=args.held_out,
                                         seed=args.seed)
    except TaskError as error:
        Console(stderr=True).print(f"[bold red]error[/]: {error}", highlight=False)
        return 2
    print(f"train: {train}\nheld out: {held_out}")
    return 0


def tasks_generate(args: argparse.Namespace) -> int:
    from rich.console import Console

    from harnessrl.rollout.tasks.tablegen import TIERS, generate_sets, write_sets

    tiers = tuple(args.tiers.split(",")) if args.tiers else TIERS
    try:
        if args.train < 0 or args.held_out < 0:
            raise ValueError("--train and --held-out must be 0 or more")
        counts = write_sets(generate_sets(args.seed, args.train, args.held_out, tiers),
                            args.out)
    except (ValueError, FileExistsError) as error:
        Console(stderr=True).print(f"[bold red]error[/]: {error}", highlight=False)
        return 2
    print(f"train: {args.out / 'train'} ({counts['train']} tasks)\n"
          f"held out: {args.out / 'held_out'} ({counts['held_out']} tasks)")
    return 0
