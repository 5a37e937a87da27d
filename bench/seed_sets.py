"""bench/seed_table.py's task sets: the generated tasks, the copies a phase runs on (a
calibration chunk, an eval chunk, a seed's selected training and held-out tasks), each
made once under STATE/tasks and the same on every rerun."""

from __future__ import annotations

import argparse
import inspect
import random
import shutil
from pathlib import Path

import seed_stats
from seed_state import State


def generated(state: State, args: argparse.Namespace, tiers: list[str], count: tuple[int, int]
              ) -> Path:
    """The generated task set (tablegen) for these tiers, written once under STATE/tasks."""
    out = state.root / "tasks" / f"seed{args.task_seed}-{'-'.join(tiers)}-{count[0]}-{count[1]}"
    if (out / "manifest.json").is_file():
        return out
    from harnessrl.rollout.tasks import tablegen

    # The generator's keyword for the held-out count (heldout / held_out), whichever it has.
    held = next(p for p in ("heldout", "held_out")
                if p in inspect.signature(tablegen.generate_sets).parameters)
    sets = tablegen.generate_sets(seed=args.task_seed, train=count[0], tiers=tiers,
                                  **{held: count[1]})
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    tablegen.write_sets(sets, partial)
    partial.rename(out)
    return out


def split_dir(tasks: Path, name: str) -> Path:
    names = ("train",) if name == "train" else ("heldout", "held_out")
    found = [tasks / n for n in names if (tasks / n).is_dir()]
    if not found:
        raise FileNotFoundError(f"{tasks}: no {' or '.join(names)} directory")
    return found[0]


def sample(source: Path, ids: list[str], out: Path) -> Path:
    """A task directory holding copies of `ids` from `source` (made once)."""
    if out.is_dir():
        return out
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for task_id in ids:
        shutil.copytree(source / task_id, partial / task_id)
    partial.rename(out)
    return out


def tier_ids(directory: Path) -> dict[str, list[str]]:
    from harnessrl.rollout.tasks.task import load_tasks

    by_tier: dict[str, list[str]] = {}
    for task in load_tasks(directory):
        by_tier.setdefault(task.difficulty or "-", []).append(task.id)
    return {tier: sorted(ids) for tier, ids in by_tier.items()}


def seeded(ids: list[str], k: int, seed: str) -> list[str]:
    """A fixed seeded subset of k ids (all when k is 0 or at least their number)."""
    if not k or k >= len(ids):
        return sorted(ids)
    return sorted(random.Random(seed).sample(sorted(ids), k))

CHUNK = 8  # calibration tasks per cell: more tasks per tier later are new cells, not a rerun


def calibration_cells(args: argparse.Namespace, state: State, tasks: Path, label: str
                      ) -> list[tuple[str, str, Path]]:
    """(unit, harness, task dir) per chunk of CHUNK tasks of each tier and split: a tier's
    tasks in a fixed seeded order, so `--calib-per-tier` can grow and the chunks measured
    stay valid."""
    cells = []
    for split in args.calib_splits:
        by_tier = tier_ids(split_dir(tasks, split))
        for tier in args.calib_tiers:
            ids = by_tier.get(tier, [])
            order = random.Random(f"{args.task_seed}:calib:{split}:{tier}").sample(ids, len(ids))
            wanted = order[:args.calib_per_tier]
            for n in range(0, len(wanted), CHUNK):
                chunk = f"{split}/{tier}/c{n // CHUNK}"
                where = sample(split_dir(tasks, split), sorted(wanted[n:n + CHUNK]),
                               state.root / "tasks" / f"calib-{chunk.replace('/', '-')}")
                cells += [(f"calib/{label}/{chunk}/{h}", h, where)
                          for h in args.calib_harnesses]
    return cells


def eval_chunks(state: State, heldout: Path) -> list[tuple[str, Path]]:
    """The held-out tasks in chunks of CHUNK, each a unit of its own (`c<n>of<N>`; the
    report merges a cell's chunks once all are in): an arm's eval is ~25 minutes per
    harness and temperature, and a kill then loses one chunk's minutes, not the cell."""
    ids = sorted(p.name for p in heldout.iterdir() if p.is_dir())
    total = -(-len(ids) // CHUNK)
    return [(f"c{n}of{total}", sample(heldout, ids[n * CHUNK:(n + 1) * CHUNK],
                                      state.root / "tasks" / f"{heldout.name}-c{n}of{total}"))
            for n in range(total)]


def seed_tasks(args: argparse.Namespace, state: State, tasks: Path, seed: int
               ) -> tuple[Path, Path]:
    """The seed's training and held-out task dirs: the whole train split and a seeded
    held-out sample, or (--select) the tasks whose calibrated pass rate for this seed's
    start, in the train harness at the training temperature, lies in --band."""
    held = split_dir(tasks, "heldout")
    if not args.select:
        ids = seeded(sorted(p.name for p in held.iterdir() if p.is_dir()), args.heldout_sample,
                     f"{args.task_seed}:heldout")
        return split_dir(tasks, "train"), sample(
            held, ids, state.root / "tasks" / f"heldout-{len(ids)}-{tasks.name}")
    label = (f"sft-s{seed}" if args.start == "sft" else "base") + f"-t{args.calib_temperature:g}"
    units, picked = state.all(), {}
    for split in ("train", "heldout"):
        task_rates = seed_stats.calibrated(units, label, split, args.train_harness)
        picked[split] = seed_stats.select(task_rates, args.band,
                                          args.heldout_sample if split == "heldout" else 0,
                                          f"{args.task_seed}:select:{seed}")
        if not picked[split]:
            raise SystemExit(f"--select: no calibrated {split} task of {label} in "
                             f"{args.train_harness} in the band {args.band}: calibrate first")
    where = state.root / "tasks"
    return (sample(split_dir(tasks, "train"), picked["train"],
                   where / f"selected-s{seed}-train-{len(picked['train'])}"),
            sample(held, picked["heldout"],
                   where / f"selected-s{seed}-heldout-{len(picked['heldout'])}"))
