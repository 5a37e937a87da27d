"""The seed table's visit-by-visit diagnosis (issue 46): from a real trace store written by
hand, each training task's groups in order, eval and unscored rollouts left out, kept
beside the run's progress lines and mirrored with the records. No model runs."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import seed_visits  # noqa: E402
from seed_state import State  # noqa: E402

from harnessrl.store.writer import TraceStore  # noqa: E402
from harnessrl.types import Outcome, Rollout  # noqa: E402


def _fill(run_dir: Path, results: list[tuple[str, int, str, float | None, str | None]]) -> None:
    """(task, sample, status, verifier reward, purpose) per rollout."""
    now = time.time()
    with TraceStore(run_dir) as store:
        async def fill() -> None:
            for n, (task, sample, status, reward, purpose) in enumerate(results):
                key = f"k{n}"
                meta = {"task": task, "sample": sample, **({"purpose": purpose} if purpose
                                                           else {})}
                await store.put_rollout(Rollout(key, now + n, now + n + 1, metadata=meta))
                await store.put_outcome(Outcome(
                    harness="h", harness_version="1", task=task, sample=sample, rollout=key,
                    status=status, reward=reward, verifier_reward=reward))  # type: ignore[arg-type]
        asyncio.run(fill())


def test_each_tasks_groups_are_its_visits_without_eval_or_unscored_rollouts(tmp_path):
    state = State(tmp_path / "state", mirror=tmp_path / "record")
    run_dir = state.work("train/rl-one/s0")
    run_dir.mkdir(parents=True)
    _fill(run_dir, [
        ("a", 0, "done", 0.0, None), ("a", 1, "done", 1.0, None),  # visit 0: 1/2
        ("a", 2, "done", 1.0, None), ("a", 3, "infra_error", None, None),  # visit 1: 1/1
        ("a", 4, "done", 0.0, "eval"),  # an eval rollout on the same counter: not a visit
        ("b", 0, "done", 1.0, None), ("b", 1, "done", 1.0, None),  # visit 0: 2/2
        ("b", 2, "done", 0.0, None), ("b", 3, "done", 0.0, None),  # visit 1: 0/2
        ("c", 0, "done", 1.0, None)])  # one visit: no change to tell
    assert seed_visits.measure(run_dir, group=2) == {
        "a": [[1, 2], [1, 1]], "b": [[2, 2], [0, 2]], "c": [[1, 1]]}

    seed_visits.keep(state.root, ["train/rl-one/s0", "train/control/s0"], group=2)
    state.mirrored()
    kept = "progress/train__rl-one__s0" + seed_visits.VISITS
    assert (state.root / kept).is_file() and (tmp_path / "record" / kept).is_file()
    assert not (state.root / ("progress/train__control__s0" + seed_visits.VISITS)).exists()

    text = "\n".join(seed_visits.section(tmp_path / "record"))  # from the records alone
    # a: 50% -> 100% (+50), b: 100% -> 0% (-100): mean first 75%, last 50%, change -25
    assert "| `train/rl-one/s0` | 2 | 75% | 50% | -25.0 | 1 / 1 (1.00) |" in text
    assert "- `train/rl-one/s0`: a 1/2 1/1; b 2/2 0/2" in text and " c " not in text


def test_no_store_kept_says_so(tmp_path):
    assert seed_visits.section(State(tmp_path).root) == ["No training run's store kept yet."]
