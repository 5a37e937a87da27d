"""The seed table's units (issue 46), on synthetic records and generated tasks: the power
estimate, the calibration's selector, the control arm's config, the pooled paired
statistics and the report built from them. No model runs: nothing here makes a result."""

from __future__ import annotations

import itertools
import json
import math
import random
import sys
from pathlib import Path
from statistics import NormalDist

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import arms  # noqa: E402
import seed_budget  # noqa: E402
import seed_pooled  # noqa: E402
import seed_runs  # noqa: E402
import seed_stats as st  # noqa: E402
import seed_table  # noqa: E402
from seed_state import State, merged  # noqa: E402


# ------------------------------------------------------------------ the power estimate
def simulated_power(rates: list[float], change: float, samples: int, seeds: int,
                    runs: int = 3000) -> float:
    """The share of simulated experiments whose paired mean change is significant at 0.05
    (the null variance from the start rates, as detectable_change assumes)."""
    rng = random.Random(7)
    units = [p for p in rates for _ in range(seeds)]
    sd = math.sqrt(sum(2 * p * (1 - p) / samples for p in units)) / len(units)
    z = NormalDist().inv_cdf(0.975)
    hits = 0
    for _ in range(runs):
        total = 0.0
        for p in units:
            q = min(1.0, p + change)
            start = sum(rng.random() < p for _ in range(samples)) / samples
            arm = sum(rng.random() < q for _ in range(samples)) / samples
            total += arm - start
        hits += abs(total / len(units)) / sd > z
    return hits / runs


def test_detectable_change_has_the_power_it_claims() -> None:
    rates = [0.3, 0.45, 0.5, 0.6, 0.75] * 8  # 40 tasks in the band
    change = st.detectable_change(rates, samples=4, seeds=1)
    assert 0.75 <= simulated_power(rates, change, 4, 1) <= 0.85
    assert simulated_power(rates, change / 2, 4, 1) < 0.5


def test_detectable_change_shrinks_with_tasks_samples_and_seeds() -> None:
    rates = [0.5] * 40
    one = st.detectable_change(rates, 4)
    assert st.detectable_change(rates, 4, seeds=3) == pytest.approx(one / math.sqrt(3))
    assert st.detectable_change(rates * 4, 4) == pytest.approx(one / 2)
    assert st.detectable_change(rates, 16) == pytest.approx(one / 2)
    assert st.detectable_change([0.0, 1.0], 4) == 0.0  # no variance: any change is seen
    with pytest.raises(ValueError):
        st.detectable_change([], 4)
    with pytest.raises(ValueError):
        st.detectable_change([1.5], 4)


def test_spread_share_counts_the_groups_that_are_neither_all_pass_nor_all_fail() -> None:
    for p, group in [(0.3, 8), (0.85, 8), (0.5, 4), (0.05, 8)]:
        brute = sum(math.prod(p if x else 1 - p for x in outcome)
                    for outcome in itertools.product([0, 1], repeat=group)
                    if 0 < sum(outcome) < group)
        assert st.spread_share(p, group) == pytest.approx(brute)
    assert st.expected_spread([], 8) is None
    assert st.expected_spread([0.0, 1.0], 8) == 0.0


# ------------------------------------------------------------------ calibration
def rollouts(task: str, passed: list[bool], infra: int = 0) -> dict[str, dict]:
    out = {f"{task}#{n}": {"status": "done", "passed": ok, "tool_calls": 1}
           for n, ok in enumerate(passed)}
    out |= {f"{task}#{len(passed) + n}": {"status": "infra_error", "passed": False,
                                          "tool_calls": 0} for n in range(infra)}
    return out


def test_rates_pool_samples_and_leave_infrastructure_errors_unscored() -> None:
    per_task = {**rollouts("lookup-a", [True, False, True], infra=1),
                **rollouts("count-b", [False]), "filter-c": {"status": "done", "passed": True}}
    assert st.rates(per_task) == {"count-b": (0, 1), "filter-c": (1, 1), "lookup-a": (2, 3)}


def test_select_keeps_the_band_and_a_fixed_subset() -> None:
    task_rates = {"a": (1, 4), "b": (2, 4), "c": (3, 4), "d": (4, 4), "e": (0, 0),
                  "f": (2, 5), "g": (3, 8)}
    assert st.select(task_rates, [0.3, 0.8]) == ["b", "c", "f", "g"]
    picked = st.select(task_rates, [0.3, 0.8], k=2, seed="x")
    assert len(picked) == 2 and set(picked) <= {"b", "c", "f", "g"}
    assert picked == st.select(task_rates, [0.3, 0.8], k=2, seed="x")
    assert st.select(task_rates, [0.9, 1.0]) == ["d"]


def small_args(tmp: Path, *extra: str) -> tuple:
    args = seed_table.parse(["run", "--state", str(tmp), "--train-tasks", "24", "--heldout",
                             "24", "--tiers", "lookup,count", "--harnesses", "mini-swe-agent",
                             "--start", "sft", "--select", "--heldout-sample", "3", *extra])
    return args, State(tmp)


def test_select_builds_the_seeds_task_dirs_from_its_calibration(tmp_path: Path) -> None:
    args, state = small_args(tmp_path)
    tasks = seed_table.generated(state, args, args.tiers, (24, 24))
    with pytest.raises(SystemExit, match="calibrate first"):
        seed_table.seed_tasks(args, state, tasks, 0)
    rng = random.Random(1)
    expected = {}
    for split in ("train", "heldout"):
        ids = sorted(p.name for p in seed_table.split_dir(tasks, split).iterdir())
        per_task = {}
        for task in ids[:16]:
            passed = [rng.random() < 0.5 for _ in range(4)]
            per_task |= rollouts(task, passed)
        state.save(f"calib/sft-s0-t1/{split}/lookup/c0/mini-swe-agent", {"per_task": per_task})
        # another seed's start, harness and temperature must not be read for seed 0
        state.save(f"calib/sft-s1-t1/{split}/lookup/c0/mini-swe-agent",
                   {"per_task": {k: {**v, "passed": True} for k, v in per_task.items()}})
        state.save(f"calib/sft-s0-t0.6/{split}/lookup/c0/mini-swe-agent",
                   {"per_task": {k: {**v, "passed": True} for k, v in per_task.items()}})
        expected[split] = [t for t, (a, n) in st.rates(per_task).items() if 0.3 <= a / n <= 0.8]
    train, held = seed_table.seed_tasks(args, state, tasks, 0)
    assert sorted(p.name for p in train.iterdir()) == expected["train"]
    assert len(list(held.iterdir())) == 3
    assert {p.name for p in held.iterdir()} <= set(expected["heldout"])


def test_calibration_cells_grow_by_chunks_without_changing_the_measured_ones(tmp_path: Path
                                                                             ) -> None:
    state = State(tmp_path)
    first = seed_table.parse(["calibrate", "--train-tasks", "40", "--heldout", "24",
                              "--tiers", "lookup,count", "--calib-tiers", "lookup",
                              "--calib-per-tier", "8", "--harnesses", "mini-swe-agent"])
    tasks = seed_table.generated(state, first, first.tiers, (40, 24))
    before = seed_table.calibration_cells(first, state, tasks, "base-t1")
    more = seed_table.parse(["calibrate", "--train-tasks", "40", "--heldout", "24",
                             "--tiers", "lookup,count", "--calib-tiers", "lookup",
                             "--calib-per-tier", "16", "--harnesses", "mini-swe-agent"])
    after = seed_table.calibration_cells(more, state, tasks, "base-t1")
    assert after[:1] == before[:1] and len(after) == 2 * len(before) == 4
    ids = [sorted(p.name for p in where.iterdir()) for _, _, where in after]
    assert all(i and all(t.startswith("lookup") for t in i) for i in ids)
    assert not set(ids[0]) & set(ids[1])  # the chunks of a split hold distinct tasks


def test_an_arms_eval_is_chunked_into_units_that_cover_the_held_out_tasks_once(
        tmp_path: Path) -> None:
    held = tmp_path / "held"
    for n in range(19):
        (held / f"lookup-{n:02}").mkdir(parents=True)
    chunks = seed_table.eval_chunks(State(tmp_path / "state"), held)
    assert [name for name, _ in chunks] == ["c0of3", "c1of3", "c2of3"]
    ids = [sorted(p.name for p in where.iterdir()) for _, where in chunks]
    assert [len(i) for i in ids] == [8, 8, 3]
    assert sorted(itertools.chain(*ids)) == sorted(p.name for p in held.iterdir())
    assert seed_table.eval_chunks(State(tmp_path / "state"), held) == chunks  # made once


def test_chunks_merge_into_their_cell_only_when_all_are_in() -> None:
    timing = {"seconds": 2.0, "lock_wait": 0.5, "started": "2026-12-05T01:00:00Z",
              "finished": "2026-12-05T01:05:00Z"}
    units = {"eval/sft/s0/msa/c0of2": {**cell({"a": [True, False]}), **timing,
                                       "turn_errors": {"timeout": 1}},
             "eval/sft/s0/msa/c1of2": {**cell({"b": [True, True]}), **timing,
                                       "finished": "2026-12-05T02:00:00Z",
                                       "turn_errors": {"timeout": 2, "engine": 1}},
             "eval/sft/s0/pi/c1of2": {**cell({"b": [True]}), **timing},
             "calib/x/heldout/lookup/c0/msa": cell({"c": [True]})}
    whole, partial = merged(units)
    assert set(whole) == {"eval/sft/s0/msa", "calib/x/heldout/lookup/c0/msa"}
    one = whole["eval/sft/s0/msa"]
    assert set(one["per_task"]) == {"a#0", "a#1", "b#0", "b#1"} and one["chunks"] == 2
    assert (one["seconds"], one["lock_wait"]) == (4.0, 1.0)
    assert one["finished"] == "2026-12-05T02:00:00Z"
    assert one["turn_errors"] == {"timeout": 3, "engine": 1}
    assert partial == {"eval/sft/s0/pi": (1, 2)}


def test_the_sft_start_has_its_own_budget(tmp_path: Path) -> None:
    common = ["--tiers", "lookup", "--sft-steps", "4", "--start", "sft"]
    seed_budget.check_budget(State(tmp_path), seed_table.parse(["sft", *common]))
    # the run's own budget may be chosen after the start: other steps, samples, band
    seed_budget.check_budget(State(tmp_path), seed_table.parse(
        ["run", *common, "--steps", "30", "--eval-samples", "4", "--select"]))
    with pytest.raises(SystemExit, match="sft_lr"):
        seed_budget.check_budget(State(tmp_path), seed_table.parse(
            ["run", *common, "--steps", "30", "--eval-samples", "4", "--select",
             "--sft-lr", "1e-3"]))
    with pytest.raises(SystemExit, match="eval_samples"):
        seed_budget.check_budget(State(tmp_path), seed_table.parse(
            ["run", *common, "--steps", "30", "--select"]))
    # the start was built from the default harnesses' teacher rollouts: a run evaluating in
    # fewer names them as the teacher's, or is refused
    fewer = ["--harnesses", "mini-swe-agent,pi", "--steps", "30", "--eval-samples", "4",
             "--select"]
    with pytest.raises(SystemExit, match="teacher_harnesses"):
        seed_budget.check_budget(State(tmp_path / "b"), seed_table.parse(["sft", *common]))
        seed_budget.check_budget(State(tmp_path / "b"), seed_table.parse(["run", *common, *fewer]))
    assert not (tmp_path / "b" / "budget-run.json").exists()  # a refused run writes nothing
    seed_budget.check_budget(State(tmp_path / "b"), seed_table.parse(
        ["run", *common, *fewer, "--teacher-harnesses", "mini-swe-agent,aider,pi"]))
    assert json.loads((tmp_path / "b" / "budget-run.json").read_text())["harnesses"] == [
        "mini-swe-agent", "pi"]


def test_the_rl_recipe_may_change_until_an_rl_arm_finishes_and_its_runs_are_set_aside(
        tmp_path: Path) -> None:
    """A recipe found wanting mid-run (issue 46: rl-one collapsing into cut replies) is
    replaced, not mixed: the unfinished runs' lines move to STATE/replaced/ with why, their
    checkpoints go (a resume must not go on from the old recipe), the report shows them.
    Once an RL arm has finished, the recipe is fixed like the rest of the budget."""
    state = State(tmp_path / "state")
    common = ["run", "--tiers", "lookup", "--steps", "30"]
    seed_budget.check_budget(state, seed_table.parse([*common, "--lr", "5e-5"]))
    budget = state.root / "budget-run.json"  # as a state made before these keys existed
    budget.write_text(json.dumps({k: v for k, v in json.loads(budget.read_text()).items()
                                  if k not in seed_budget.ADDED}))
    run = state.work("train/rl-one/s0")
    (run / "checkpoints" / "checkpoint-10").mkdir(parents=True)
    step = {"step": 1, "trl": {"grad_norm": 0.5}, "harnesses": {"pi": {"pass_rate": 0.5}}}
    (run / "metrics.jsonl").write_text(json.dumps(step) + "\n")
    state.progress("train/rl-one/s0", run / "metrics.jsonl")
    with pytest.raises(SystemExit, match="max_tokens"):  # the rest stays fixed
        seed_budget.check_budget(state, seed_table.parse([*common, "--max-tokens", "64"]))
    assert run.is_dir()

    seed_budget.check_budget(state, seed_table.parse(
        [*common, "--lr", "2e-5", "--truncated-turns", "penalty"]))
    assert not run.exists() and not list((state.root / "progress").iterdir())
    (aside,) = (state.root / "replaced").iterdir()
    why = (aside / "why.txt").read_text()
    assert "lr: 5e-05 then, 2e-05 now" in why and "truncated_turns: 'mask' then" in why
    assert "format_penalty" not in why  # added since, with the value the state ran with
    assert json.loads((aside / "budget-run.json").read_text())["lr"] == 5e-5
    assert json.loads((state.root / "budget-run.json").read_text())["lr"] == 2e-5
    lines = seed_runs.replaced(state.root)
    assert "- `train/rl-one/s0`: 1 steps so far, 1 with a gradient." in lines
    state.record(tmp_path / "record")  # the history is committed with the records
    assert (tmp_path / "record" / "replaced" / aside.name / "why.txt").is_file()

    state.save("train/control/s0", {"steps": []})
    with pytest.raises(SystemExit, match="lr"):
        seed_budget.check_budget(state, seed_table.parse([*common, "--lr", "1e-5"]))


def test_a_finished_arms_recipe_is_replaced_only_by_name_with_its_evals_set_aside(
        tmp_path: Path) -> None:
    """After an RL arm finished, --replace-recipe WHY changes the recipe (issue 46: the
    harness's rejected replies had been trained as kept): the arm's unit and its eval
    chunks at every temperature move to STATE/replaced/<time>/units/ (the report lists
    them), its run dir is kept out of the records, other arms' units stay."""
    state = State(tmp_path / "state")
    common = ["run", "--tiers", "lookup", "--truncated-turns", "penalty"]
    seed_budget.check_budget(state, seed_table.parse(common))
    step = {"step": 1, "grad_norm": 0.5, "harnesses": {"msa": {"pass_rate": 0.5}}}
    state.save("train/rl-one/s0", {"model": str(tmp_path / "gone"), "seconds": 60,
                                   "harnesses": ["msa"], "steps": [step]})
    state.work("train/rl-one/s0").mkdir()
    chunk = {"per_task": {"a#0": {"status": "done", "passed": True},
                          "a#1": {"status": "done", "passed": False}}, "eval": {"capped": 1},
             "seconds": 1, "started": "t0", "finished": "t1"}
    for unit in ("eval/rl-one/s0/msa/c0of1", "eval@1/rl-one/s0/msa/c0of2",
                 "eval/sft/s0/msa/c0of1"):
        state.save(unit, chunk)
    state.save("probe/s0/a/lr1e-05", {"steps": [], "recipe": {}})  # its own recipe: stays
    state.work("probe/s0/a/lr1e-05").mkdir()
    penalty = [*common, "--rejected-turns", "penalty"]
    with pytest.raises(SystemExit, match="rejected_turns"):  # not without saying why
        seed_budget.check_budget(state, seed_table.parse(penalty))
    with pytest.raises(SystemExit, match="nothing to replace"):
        seed_budget.check_budget(state, seed_table.parse([*common, "--replace-recipe", "x"]))

    seed_budget.check_budget(state, seed_table.parse(
        [*penalty, "--replace-recipe", "dropped replies were trained"]))
    assert set(state.all()) == {"eval/sft/s0/msa/c0of1", "probe/s0/a/lr1e-05"}
    (aside,) = (state.root / "replaced").iterdir()
    assert sorted(p.name for p in (aside / "units").iterdir()) == [
        "eval@1__rl-one__s0__msa__c0of2.json", "eval__rl-one__s0__msa__c0of1.json",
        "train__rl-one__s0.json"]
    why = (aside / "why.txt").read_text()
    assert why.startswith("the RL recipe changed after train/rl-one/s0 finished "
                          "(--replace-recipe: dropped replies were trained): rejected_turns")
    assert sorted(p.name for p in (state.root / "work").iterdir()) == [
        f"{aside.name}__train__rl-one__s0",  # kept, under a name no resume finds
        "probe__s0__a__lr1e-05"]
    text = "\n".join(seed_runs.replaced(state.root))
    assert "- `eval/rl-one/s0/msa`: 1/2 passed, 1 stopped at the step cap" in text
    assert "- `eval@1/rl-one/s0/msa`: 1 of 2 chunks measured" in text
    assert "- `train/rl-one/s0` (msa): 1 steps in 1 min" in text


# ------------------------------------------------------------------ the control arm
def test_the_control_is_rl_one_with_advantages_shuffled_within_groups(tmp_path: Path) -> None:
    args = seed_table.parse(["run", "--eval-every", "5"])
    args.heldout_dir = tmp_path / "held"
    one, control = (arms.rl_config(args, tmp_path, 0, arm, tmp_path / "m", tmp_path / "r")
                    for arm in ("rl-one", "control"))
    assert control["grpo"].pop("advantage_control") == "shuffle"
    assert control == one  # the same sampling, steps, optimizer, tasks and eval
    assert one["grpo"].get("advantage_control") is None
    assert "control" in seed_budget.RL_ARMS and arms.arm_harnesses(args, "control") == [
        args.train_harness]


def test_the_control_config_is_one_the_trainer_accepts_when_it_has_the_setting(
        tmp_path: Path) -> None:
    from harnessrl.train.config import GRPOSettings

    if "advantage_control" not in GRPOSettings.__struct_fields__:
        pytest.skip("[grpo] advantage_control (issue 45) is not in this tree yet")
    import msgspec

    args = seed_table.parse(["run"])
    args.heldout_dir = tmp_path
    grpo = arms.rl_config(args, tmp_path, 0, "control", tmp_path, tmp_path)["grpo"]
    assert msgspec.convert(grpo, GRPOSettings).advantage_control == "shuffle"


# ------------------------------------------------------------------ pooled statistics
def test_sign_test_is_the_exact_binomial() -> None:
    for gained, lost in [(0, 5), (6, 0), (3, 4), (10, 2), (0, 0)]:
        n = gained + lost
        extreme = sum(1 for signs in itertools.product([0, 1], repeat=n)
                      if min(sum(signs), n - sum(signs)) <= min(gained, lost))
        assert st.sign_test(gained, lost) == pytest.approx(min(1.0, extreme / 2 ** n))


def test_bootstrap_interval_holds_the_mean_and_narrows_with_more_units() -> None:
    rng = random.Random(3)
    few = [rng.choice([-0.25, 0.0, 0.25, 0.5]) for _ in range(30)]
    many = few * 8
    mean, low, high = st.bootstrap_mean(few)
    assert low <= mean <= high and mean == pytest.approx(sum(few) / len(few))
    _, low8, high8 = st.bootstrap_mean(many)
    assert (high8 - low8) < (high - low) / 2
    assert st.bootstrap_mean(few) == st.bootstrap_mean(few)  # seeded: reproducible
    assert st.bootstrap_mean([0.5] * 10)[1:] == (0.5, 0.5)


def test_t_interval_over_seeds() -> None:
    assert st._t_quantile(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-3)
    assert st._t_quantile(0.975, 400) == pytest.approx(NormalDist().inv_cdf(0.975), rel=1e-2)
    mean, low, high = st.interval_over_seeds([0.1, 0.2, 0.3])
    assert mean == pytest.approx(0.2) and low is not None and high is not None
    assert low < 0.1 and high > 0.3 and high - mean == pytest.approx(mean - low)
    assert st.interval_over_seeds([0.4]) == (0.4, None, None)


def cell(results: dict[str, list[bool]], calls: int = 2, unparsed: int = 0) -> dict:
    per_task = {}
    for task, passed in results.items():
        for n, ok in enumerate(passed):
            per_task[f"{task}#{n}"] = {"status": "done", "passed": ok, "tool_calls": calls,
                                       "tool_call_source": "harness", "turns": 4,
                                       "answered_turns": 4, "unparsed_turns": unparsed}
    return {"per_task": per_task, "eval": {}}


def test_paired_differences_per_task_and_seed() -> None:
    units = {"eval/rl-one/s0/msa": cell({"a": [True] * 4, "b": [False] * 4}),
             "eval/sft/s0/msa": cell({"a": [True, False, False, False], "b": [False] * 4}),
             "eval/rl-one/s1/msa": cell({"a": [True, True, False, False]}),
             "eval/sft/s1/msa": cell({"a": [True, True, True, True]}),
             "eval/rl-one/s2/msa": cell({"a": [True] * 4})}  # no start in s2: not paired
    found = seed_pooled.differences(units, "eval", "rl-one", "sft", "msa")
    assert found == {"s0": [0.75, 0.0], "s1": [-0.5]}
    text = seed_pooled.paired_cell(found)
    assert text.startswith("+8.3 pts") and "tasks +1 -1" in text and "n 3 in 2 seeds" in text


def test_bonus_counts_the_calls_run_on_co_solved_tasks_and_the_unparsed_share() -> None:
    units = {"eval/rl-one/s0/msa": cell({"a": [True, False], "b": [True, True]}, calls=4),
             "eval/rl-one-bonus/s0/msa": cell({"a": [True, True], "c": [True]}, calls=3,
                                               unparsed=2),
             "eval/rl-one/s1/msa": cell({"a": [True]}, calls=2),
             "eval/rl-one-bonus/s1/msa": cell({"a": [True]}, calls=1, unparsed=1)}
    assert seed_pooled.co_solved_calls(units["eval/rl-one/s0/msa"]["per_task"],
                                       units["eval/rl-one-bonus/s0/msa"]["per_task"]) == [
        (4.0, 3.0)]
    text = "\n".join(seed_pooled.bonus(units, "eval", ["msa"], ["rl-one", "rl-one-bonus"]))
    assert "| msa | s0 | 1 | 4.00 | 3.00 | -25% | harness |" in text
    assert "| msa | s1 | 1 | 2.00 | 1.00 | -50% | harness |" in text
    assert "-38% (" in text and "2 seeds" in text
    assert "| msa | 0%" in text and "| 38% (" in text  # 2/4 and 1/4 of the turns


def test_unparsed_marks_a_call_in_text_that_was_not_parsed() -> None:
    from harnessrl.types import Completion, Text, Tokens, ToolCall

    def turn(*parts: object) -> object:
        completion = Completion(model="m", parts=tuple(parts), finish_reason="stop",  # type: ignore[arg-type]
                                usage=None, tokens=Tokens(None, None, None))
        return type("Turn", (), {"completion": completion})()

    assert seed_table.unparsed(turn(Text('<tool_call>{"name": "bash"}</tool_call>')))
    assert not seed_table.unparsed(turn(Text("done"), ToolCall("1", "bash", "{}")))
    assert not seed_table.unparsed(turn(Text("<tool_call>x"), ToolCall("1", "bash", "{}")))
    assert not seed_table.unparsed(turn(Text("the answer is 4")))


def saved(state: State, name: str, result: dict) -> None:
    """A unit as seed_state.unit stores it (its wall time beside the result)."""
    state.save(name, {**result, "seconds": 1.0, "lock_wait": 0.0,
                      "started": "2026-12-05T00:00:00Z", "finished": "2026-12-05T00:00:01Z"})


def test_report_writes_the_experiment_sections_from_synthetic_records(tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    (state.root / "budget-run.json").write_text(json.dumps(
        {"start": "sft", "harnesses": ["msa"], "train_harness": "msa", "band": [0.3, 0.8],
         "group": 8, "eval_temperatures": [0.6], "seeds": [0, 1], "steps": 2}))
    saved(state, "calib/sft-s0-t1/heldout/lookup/c0/msa",
               {"per_task": {**rollouts("lookup-a", [True, False, True, False]),
                             **rollouts("lookup-b", [True] * 4)}})
    for seed in (0, 1):
        saved(state, f"eval/sft/s{seed}/msa", cell({"a": [False] * 4, "b": [True] * 4}))
        saved(state, f"eval/control/s{seed}/msa", cell({"a": [False] * 4, "b": [True] * 4}))
        # rl-one measured in two chunks of one task each: merged, the same cell
        saved(state, f"eval/rl-one/s{seed}/msa/c0of2", cell({"a": [True] * 4}))
        saved(state, f"eval/rl-one/s{seed}/msa/c1of2", cell({"b": [True] * 4}))
        saved(state, f"train/rl-one/s{seed}", {
            "model": str(tmp_path / "none" / "model"), "seconds": 1, "harnesses": ["msa"],
            "steps": [{"step": n, "reward": 0.5, "groups_with_spread": 0.75, "kl": 0.01,
                       "harnesses": {}} for n in (1, 2)],
            "evals": [{"step": 2, "eval": {"msa": {"passed": 3, "rollouts": 4}}}]})
    saved(state, "eval/rl-one/s2/msa/c0of2", cell({"a": [False] * 4}))  # half measured
    args = seed_table.parse(["report", "--state", str(state.root), "--harnesses", "msa",
                             "--arms", "sft,rl-one,control", "--out", str(tmp_path / "r.md"),
                             "--plot", str(tmp_path / "r.png")])
    text = seed_table.seed_report.write(args, state.root)
    assert "| sft-s0-t1 | heldout | msa | lookup | 2 | 75% (6/8) | 1 |" in text
    assert "| rl-one | +50.0 pts (+0.0 to +100.0); tasks +2 -0, sign p 0.5; n 4 in 2 seeds" \
        in text
    assert text.count("| rl-one | +50.0 pts") == 2  # against the start and the control
    assert "| rl-one | 2 | 4 | 0.75 | - | - | 0.01 |" in text
    assert "- `eval/rl-one/s2/msa`: 1 of 2 chunks measured" in text
    assert (tmp_path / "r_curves.png").is_file()


def test_every_unit_and_failure_is_mirrored_as_it_is_written(tmp_path: Path, capsys) -> None:
    """An arm's eval is a unit per chunk, and one `run` command holds hours of them: each
    reaches `--record` when it is saved, not when the command ends, and a copy that fails
    is said while the unit stays saved in the state."""
    record = tmp_path / "record"
    state = State(tmp_path / "state", record)
    state.save("eval/rl-one/s0/mini-swe-agent/c0of5", {"passed": 3})
    assert json.loads((record / "units" / "eval__rl-one__s0__mini-swe-agent__c0of5.json")
                      .read_text()) == {"passed": 3}
    state.fail("eval/rl-one/s0/pi/c0of5", "engine down")
    assert (record / "failed" / "eval__rl-one__s0__pi__c0of5.json").is_file()
    state.save("eval/rl-one/s0/pi/c0of5", {"passed": 1})  # retried: the failure goes
    assert not (record / "failed" / "eval__rl-one__s0__pi__c0of5.json").exists()

    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the folder should be")
    stuck = State(tmp_path / "state", blocked)
    stuck.save("eval/control/s0/pi/c0of5", {"passed": 2})
    assert stuck.done("eval/control/s0/pi/c0of5") == {"passed": 2}
    assert "records not copied" in capsys.readouterr().out
    assert State(tmp_path / "state", tmp_path / "state").mirror is None  # never onto itself


def test_a_training_run_s_metrics_are_recorded_and_reported_while_it_runs(tmp_path):
    """A training unit runs for hours: its metrics.jsonl so far is kept in the state and
    copied to `--record` while the child runs, and the report shows the unfinished run's
    steps and evals (a line cut mid-write is skipped), not only once it finishes."""
    from seed_state import run_child

    record = tmp_path / "record"
    state = State(tmp_path / "state", record)
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.parent.mkdir()
    step = {"step": 1, "reward": 0.9, "trl": {"loss": 0.1, "grad_norm": 0.4},
            "rejected_share": 0.5,
            "harnesses": {"mini-swe-agent": {"pass_rate": 0.75, "reward": 0.75, "turns": 4.25}}}
    evaluated = {"step": 1, "eval": {"mini-swe-agent": {"passed": 3, "rollouts": 4}}}
    lines = [json.dumps(step), json.dumps(evaluated), '{"step": 2, "rew']  # the last is cut
    # the child writes the lines, then runs on; the record must hold them by then
    child = [sys.executable, "-c", f"import time, pathlib; pathlib.Path({str(metrics)!r})"
             f".write_text({chr(10).join(lines)!r}); time.sleep(1.5)"]
    kept = record / "progress" / "train__rl-one__s0.metrics.jsonl"
    seen: list[str] = []

    def every() -> None:
        state.progress("train/rl-one/s0", metrics)
        seen.append(kept.read_text() if kept.is_file() else "")

    with (tmp_path / "log").open("w") as log:
        assert run_child(child, log, every=every, every_s=0.5) == 0
    assert "\n".join(lines) in seen  # recorded before the child ended
    report = seed_runs.in_progress(record, {})
    assert report == ["- `train/rl-one/s0`: 1 steps so far, 1 with a gradient.", "",
                      "  | step | mini-swe-agent pass rate | mini-swe-agent model calls | "
                      "groups with spread | cut | rejected | trained | grad norm |",
                      "  |---|---|---|---|---|---|---|---|",
                      "  | 1 | 75% | 4.2 | - | - | 50% | - | 0.40 |", "",
                      "  - eval while training, step 1: mini-swe-agent 3/4"]
    # a copy that fails (a full disk, say) is said, and the run goes on to its end
    def broken() -> None:
        raise OSError("no space left on device")

    with (tmp_path / "log").open("w") as log:
        assert run_child([sys.executable, "-c", "import time; time.sleep(0.8)"], log,
                         every=broken, every_s=0.2) == 0
    # its curves are drawn while it runs (dashed), and not once it is measured
    running = seed_runs.runs(record / "progress", {})
    (kept_step,) = running["train/rl-one/s0"]["steps"]
    assert kept_step["reward"] == 0.9 and seed_pooled.rollout_reward(kept_step) == 0.75
    png = tmp_path / "curves.png"
    assert seed_pooled.plot_curves({}, ["rl-one"], "mini-swe-agent", png, running)
    assert png.stat().st_size > 0
    assert not seed_pooled.plot_curves({}, ["rl-one"], "mini-swe-agent", tmp_path / "no.png",
                                       seed_runs.runs(
                                           record / "progress", {"train/rl-one/s0": {}}))
    # once the unit is measured, it is no longer in progress
    assert seed_runs.in_progress(record, {"train/rl-one/s0": {}}) == []
