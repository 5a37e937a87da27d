"""`harnessrl eval`: the same model across harnesses (pass rate, pass@k, cost per solved
task), over `run`'s flags and execution."""

from __future__ import annotations

import argparse
from pathlib import Path

from harnessrl.cli.run import add_run_arguments, execute_run, report_broken

HELP = ("the same model across harnesses: pass rate, pass@k, cost per solved task (md, "
        "csv, png)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_arguments(p)
    p.add_argument("--out", type=Path, help="where eval.md/.csv/.png go (default: "
                                            "RUN_DIR/eval)")
    p.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markdown import Markdown

    from harnessrl.rollout.evaluate import evaluate, markdown, write_all

    outcomes = execute_run(args)
    rows = evaluate(outcomes, args.samples)
    paths = write_all(rows, args.out or args.run_dir / "eval")
    Console().print(Markdown(markdown(rows)))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 1 if args.oracle and report_broken(outcomes) else 0
