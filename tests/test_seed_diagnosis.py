"""The seed table's diagnosis of whether RL taught what it trained on (issue 46): each
training task's visits in order (from a real trace store written by hand, eval and
unscored rollouts left out, kept beside the run's progress lines and mirrored with the
records), the first third of a run's steps against its last, and the probe that trains on
one task alone. No model runs."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import arms  # noqa: E402
import pytest  # noqa: E402
import seed_runs  # noqa: E402
import seed_table  # noqa: E402
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
    # a recipe replaced: the run's visits move with its lines, and stay in the section
    aside = tmp_path / "record" / "replaced" / "T1" / "progress"
    aside.mkdir(parents=True)
    (tmp_path / "record" / kept).rename(aside / Path(kept).name)
    assert "| `train/rl-one/s0 (set aside: T1)` | 2 | 75% | 50% |" in "\n".join(
        seed_visits.section(tmp_path / "record"))


def test_no_store_kept_says_so(tmp_path):
    assert seed_visits.section(State(tmp_path).root) == ["No training run's store kept yet."]


def test_a_runs_first_third_of_steps_is_set_against_its_last():
    steps = [{"harnesses": {"h": {"pass_rate": rate}}} for rate in
             (0.25, 0.5, 0.5, 0.5, 1.0, 0.75, 1.0)]
    assert seed_runs.thirds(steps, ["h", "g"]) == (
        "; training pass rate, first third of the steps against the last: h 38% -> 88%, g - -> -")
    assert seed_runs.thirds(steps[:2], ["h"]) == ""  # too few steps to split


def test_the_probe_trains_the_seeds_start_on_one_of_its_training_tasks_alone(tmp_path,
                                                                              monkeypatch):
    state = State(tmp_path / "state")
    train = tmp_path / "train"
    (train / "lookup-a").mkdir(parents=True)
    (train / "lookup-a" / "task.toml").write_text("id = 'lookup-a'")
    calls = []

    def rl(args, state, tasks, seed, arm, start, name):
        calls.append((args.eval_every, sorted(p.name for p in tasks.iterdir()), arm, name))
        return {"model": "m", "steps": []}

    monkeypatch.setattr(arms, "rl", rl)
    args = seed_table.parse(["probe", "--probe-task", "lookup-a", "--lr", "3e-5",
                             "--eval-every", "10"])
    result = arms.probe(args, state, train, 0, tmp_path / "start", {"lr": 3e-5})
    assert calls == [(0, ["lookup-a"], "rl-one", "probe/s0/lookup-a/lr3e-05")]
    assert result is not None and result["recipe"] == {"lr": 3e-5} and result["model"] == "m"
    assert state.done("probe/s0/lookup-a/lr3e-05") == result
    assert args.eval_every == 10  # the caller's settings are left as they were
    args.probe_task = "lookup-z"
    with pytest.raises(SystemExit, match="lookup-z is not one of seed 0's training tasks"):
        arms.probe(args, state, train, 0, tmp_path / "start", {})


def test_model_calls_and_capped_rollouts_per_arm_pool_the_seeds():
    import seed_pooled

    def cell(turns: list[int], capped: int) -> dict:
        return {"per_task": {f"t#{n}": {"status": "done", "passed": True, "turns": t}
                             for n, t in enumerate(turns)}, "eval": {"capped": capped}}

    units = {"eval/sft/s0/msa": cell([2, 4], 0), "eval/rl-one/s0/msa": cell([6, 8], 1),
             "eval/rl-one/s1/msa": cell([4, 6], 1), "eval@1/rl-one/s0/msa": cell([9], 1)}
    assert seed_pooled.behaviour(units, "eval", ["msa"], ["sft", "rl-one", "control"]) == [
        "| arm | msa |", "|---|---|", "| sft | 3.0 calls, 0/2 capped |",
        "| rl-one | 6.0 calls, 2/4 capped |", "| control | - |"]
