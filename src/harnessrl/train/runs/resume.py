"""What a resumed run does to the run's one store and its metrics before any new rollout:

- **Rollouts in flight at the crash** (planned rollouts with turns but no outcome) keep
  their turns. Each gets an outcome `infra_error` saying it was interrupted, and its open
  rollout records are closed with `interrupted` in their metadata: it is never trained
  (the resumed worker trains only rollouts it ran itself) and never planned again (its
  sample number is taken), and no rollout or outcome is written twice.
- **Weight versions** go on above every version used before: the checkpoint's, the newest
  any stored turn names (the crashed run may have synced past its last checkpoint), and
  the one vLLM serves.
- **metrics.jsonl** keeps the lines up to the checkpoint's step; the lines of steps the
  crash undid move to `metrics.undone.jsonl`, so the file goes on at the next step.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import msgspec

from harnessrl.store.reader import TraceReader
from harnessrl.store.writer import TraceStore
from harnessrl.train.async_grpo.transfer import version_number
from harnessrl.types import Outcome, Rollout

INTERRUPTED = "interrupted"
UNDONE_FILE = "metrics.undone.jsonl"


def interrupted(store: TraceReader) -> list[list[Rollout]]:
    """The planned rollouts without an outcome, each as its attempts' records (oldest
    first): the runner puts harness, task and sample in every record's metadata."""
    have = {(o.harness, o.task, o.sample) for o in store.outcomes()}
    attempts: dict[tuple[str, str, int], list[Rollout]] = {}
    for record in store.iter_rollouts():
        meta = record.metadata
        if not {"harness", "task", "sample"} <= set(meta):
            continue  # not the runner's (a test's or a user's own call)
        triple = (str(meta["harness"]), str(meta["task"]), int(meta["sample"]))
        if triple not in have:
            attempts.setdefault(triple, []).append(record)
    return list(attempts.values())


def mark_interrupted(store: TraceStore, reason: str) -> list[Outcome]:
    """Closes and marks every interrupted rollout and writes its `infra_error` outcome."""
    outcomes = []
    now = time.time()

    async def write() -> None:
        for records in interrupted(store):
            for record in records:
                meta = {**record.metadata, INTERRUPTED: reason}
                await store.put_rollout(msgspec.structs.replace(
                    record, metadata=meta, closed=record.closed or now))
            last = records[-1].metadata
            outcome = Outcome(
                harness=str(last["harness"]), harness_version=str(
                    last.get("harness_version", "")), task=str(last["task"]),
                sample=int(last["sample"]), rollout=records[-1].key, status="infra_error",
                attempts=len(records), error=f"{INTERRUPTED}: {reason}")
            await store.put_outcome(outcome)
            outcomes.append(outcome)

    asyncio.run(write())
    return outcomes


def newest_version(store: TraceReader) -> int:
    """The newest of harnessrl's versions (`v<n>`) any stored turn names; 0 if none."""
    rows = store.db.execute("SELECT DISTINCT weight_version FROM turns "
                            "WHERE weight_version IS NOT NULL").fetchall()
    return max((n for (name,) in rows if (n := version_number(name)) is not None), default=0)


def first_version(checkpoint_version: int, run_dir: Path, served: str | None) -> int:
    """The version counter a resumed run starts from (its cold sync names the next)."""
    stored = 0
    if (run_dir / "trace.db").exists():
        with TraceReader(run_dir) as store:
            stored = newest_version(store)
    return max(checkpoint_version, stored, version_number(served) or 0)


def rewind_metrics(path: Path, step: int) -> int:
    """Keeps the lines of steps up to `step`; later ones move to metrics.undone.jsonl.
    Returns how many moved."""
    if not path.exists():
        return 0
    keep, undone = [], []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            at = json.loads(line).get("step")
        except ValueError:
            at = None  # a line torn by the crash
        (keep if isinstance(at, int) and at <= step else undone).append(line)
    if undone:
        with (path.parent / UNDONE_FILE).open("a") as f:
            f.write("".join(u + "\n" for u in undone))
    staged = path.with_suffix(".jsonl.partial")
    staged.write_text("".join(k + "\n" for k in keep))
    staged.replace(path)
    return len(undone)


def resumed_state(cursor: int, weight_version: int,
                  fingerprint: dict[str, Any]) -> dict[str, Any]:
    """harnessrl's part of a checkpoint (besides TRL's): what the rollouts need to go on
    (the trainer's `long_run.Seam` gives the cursor and the version)."""
    return {"weight_version": int(weight_version), "task_cursor": int(cursor),
            "fingerprint": fingerprint, "saved_at": time.time()}
