"""`harnessrl export`: a run's turns or rollouts as JSONL/Parquet, or its solved rollouts as
an SFT dataset."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "write a run's turns or rollouts as JSONL/Parquet"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path)
    p.add_argument("--what", choices=["turns", "rollouts"], default="turns")
    p.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl")
    p.add_argument("-o", "--out", type=Path, required=True)
    p.add_argument("--sft", choices=["tokens", "messages"],
                   help="instead: solved rollouts as an SFT dataset (Parquet): exact ids "
                        "with assistant_masks, or conversations for a student's template")
    p.add_argument("--min-reward", type=float, default=1.0,
                   help="--sft: verifier reward a rollout needs to count as solved")
    p.add_argument("--chains", choices=["main", "all"], default="main",
                   help="--sft tokens: each solved rollout's main chain, or every chain")
    p.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from harnessrl.train.export.rollouts import export

    if args.sft:
        return _export_sft(args)
    count = export(args.run_dir, args.out, what=args.what, fmt=args.format)
    print(f"wrote {count} {args.what} to {args.out}")
    return 0


def _export_sft(args: argparse.Namespace) -> int:
    from harnessrl.train.export.sft import RETOKENIZED_NOTE, export_sft

    result = export_sft(args.run_dir, args.out, kind=args.sft, min_reward=args.min_reward,
                        chains=args.chains)
    skipped = ", ".join(f"{why}: {n}" for why, n in result.skipped.items())
    print(f"wrote {result.rows} SFT rows ({args.sft}) from {result.rollouts} solved rollouts "
          f"to {result.path}" + (f"; solved rollouts left out ({skipped})" if skipped else ""))
    if result.retokenized:
        print(RETOKENIZED_NOTE)
    return 0
