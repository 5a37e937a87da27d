"""The seed table on a replaced machine (issue 46): a new state starts from the records
committed by the lost one, a model the records name but this machine lacks is built
again (an SFT start, checked against its first build) or trained again (an RL arm whose
eval is not whole), and a run whose checkpoints are gone keeps its measured steps. No
model runs: the units' work is replaced by stand-ins that write what the real work would."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import arms  # noqa: E402
import seed_table  # noqa: E402
from seed_state import State, unit  # noqa: E402

LOSSES = [2.47, 1.1, 0.03]


ROWS = [{"input_ids": [1, 2, 3], "assistant_masks": [0, 1, 1]},
        {"input_ids": [4, 5, 6, 7, 8], "assistant_masks": [0, 1, 1, 1, 1]}]


def lost_machine(tmp: Path, rows: bool = False) -> Path:
    """A record as a lost machine left it: seed 0's teachers, its SFT start (the model at
    a path that is gone; with `rows`, the rows it trained on), an eval chunk, a
    calibration chunk, a failure and a running unit's progress lines."""
    old = State(tmp / "old", tmp / "record")
    if rows:
        arms.sft_data(old, 0, lambda: (ROWS, {"pi": 2}))
    for harness in ("mini-swe-agent", "pi"):
        old.save(f"teacher/{harness}/s0", {"run_dir": str(tmp / "old/work/t"), "solved": 16})
    old.save("sft/s0", {"model": str(tmp / "old/models/sft-s0"), "rows": 2,
                        "trained_tokens": 6, "losses": LOSSES})
    old.save("eval/sft/s0/pi/c0of5", {"per_task": {"a": {"passed": True}},
                                      "finished": "2026-12-05T09:37:05Z"})
    old.save("calib/sft-s0-t1/train/lookup/c0/pi", {"per_task": {},
                                                    "finished": "2026-12-05T05:21:25Z"})
    old.fail("eval/sft/s0/pi/c1of5", "engine down")
    metrics = tmp / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")
    old.progress("train/rl-one/s0", metrics)
    (old.root / "notes.md").write_text("- a note\n")
    old.mirrored()
    return tmp / "record"


def test_a_new_state_starts_from_its_record_and_never_wipes_it(tmp_path: Path) -> None:
    record = lost_machine(tmp_path)
    new = State(tmp_path / "new", record)
    assert new.done("eval/sft/s0/pi/c0of5")["per_task"] == {"a": {"passed": True}}
    assert set(new.all()) == set(State(tmp_path / "old").all())
    assert (new.root / "progress" / "train__rl-one__s0.metrics.jsonl").is_file()
    assert (new.root / "notes.md").read_text() == "- a note\n"
    assert new.all("failed") == {}  # a failure is tried again, not carried over
    new.save("eval/sft/s0/pi/c1of5", {"per_task": {}})
    # the first copy back keeps every unit the lost machine measured
    assert len(list((record / "units").glob("*.json"))) == 6
    assert not list((record / "failed").glob("*.json"))
    # a state that has units of its own is not overwritten from the record
    (record / "units" / "eval__rl-one__s0__pi__c0of5.json").write_text("{}")
    assert State(tmp_path / "new", record).done("eval/rl-one/s0/pi/c0of5") is None


def stand_ins(monkeypatch: pytest.MonkeyPatch, losses: list[float], calls: list[str]) -> None:
    """The teacher runs and the SFT training, replaced by what they record."""
    def teacher(args, state, train, seed, harness):
        def work() -> dict:
            calls.append(harness)
            return {"run_dir": str(state.work(harness)), "solved": 16}

        return unit(state, f"teacher/{harness}/s{seed}", work)

    def sft(args, state, runs, seed, base, name):
        rows, _ = arms.sft_data(state, seed, lambda: (ROWS, {"pi": 2}))
        model = state.root / "models" / f"sft-s{seed}"
        model.mkdir(parents=True)
        return {**arms.compared(state.first_build(name), losses, rows), "model": str(model),
                "rows": len(rows), "trained_tokens": 6, "losses": losses}

    monkeypatch.setattr(arms, "teacher", teacher)
    monkeypatch.setattr(arms, "sft", sft)


@pytest.mark.parametrize(("losses", "same"), [(LOSSES, True), ([2.47, 1.2, 0.03], False)])
def test_an_sft_start_whose_model_is_gone_is_built_again_and_checked_against_the_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, losses: list[float], same: bool
        ) -> None:
    """Its rows not recorded (seed 0 of the experiment): the teachers run again."""
    state = State(tmp_path / "new", lost_machine(tmp_path))
    args = seed_table.parse(["run", "--state", str(state.root), "--teacher-harnesses",
                             "mini-swe-agent,pi", "--start", "sft"])
    calls: list[str] = []
    stand_ins(monkeypatch, losses, calls)
    model = state.root / "models" / "sft-s0"
    assert arms.start_model(args, state, tmp_path, 0, tmp_path / "base") == model
    assert model.is_dir()
    assert calls == ["mini-swe-agent", "pi"]  # the teachers ran again: their runs were gone
    rebuilt = state.done("sft/s0")
    assert rebuilt is not None and rebuilt["same_as_first_build"] is same
    assert rebuilt["first_build"]["max_loss_difference"] == pytest.approx(
        0.0 if same else 0.1)
    assert state.first_build("sft/s0")["model"] == str(tmp_path / "old/models/sft-s0")
    assert (tmp_path / "record" / "rebuilt" / "sft__s0.json").is_file()
    # the calibration only chose tasks: it stays whichever build this is
    assert state.done("calib/sft-s0-t1/train/lookup/c0/pi") is not None
    # the start's eval was measured on the first build: kept if this is the same model,
    # set aside to be measured again if not
    assert (state.done("eval/sft/s0/pi/c0of5") is not None) is same
    aside = list((state.root / "replaced").glob("*/units/eval__sft__s0__pi__c0of5.json"))
    assert len(aside) == (0 if same else 1)
    # built: asked again, nothing runs again and nothing measured since is set aside
    calls.clear()
    state.save("eval/sft/s0/pi/c0of5", {"per_task": {}, "finished": "9999"})
    assert arms.start_model(args, state, tmp_path, 0, tmp_path / "base") == model
    assert calls == [] and len(state.all("rebuilt")) == 3
    assert state.done("eval/sft/s0/pi/c0of5") is not None


def test_a_start_is_built_again_from_its_recorded_rows_without_its_teachers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = lost_machine(tmp_path, rows=True)
    assert (record / "rows" / "sft-s0.json.gz").is_file()  # 10 KB for seed 0 of the experiment
    state = State(tmp_path / "new", record)
    args = seed_table.parse(["run", "--state", str(state.root), "--teacher-harnesses",
                             "mini-swe-agent,pi", "--start", "sft"])
    calls: list[str] = []
    stand_ins(monkeypatch, LOSSES, calls)
    arms.start_model(args, state, tmp_path, 0, tmp_path / "base")
    assert calls == []  # the rows were recorded: no teacher ran
    assert state.done("sft/s0")["same_as_first_build"] is True
    assert set(state.all("rebuilt")) == {"sft/s0"}
    made: list[int] = []
    assert arms.sft_data(state, 0, lambda: made.append(1) or ([], {})) == (ROWS, {"pi": 2})
    assert made == []


def test_the_units_measured_on_a_seeds_start_are_told_from_the_rest() -> None:
    derived = ["eval/sft/s0/pi/c0of5", "eval@1/rl-one/s0/pi/c1of5", "train/control/s0",
               "probe/s0/lookup-1/lr3e-05"]
    others = ["calib/sft-s0-t1/train/lookup/c0/pi", "sft/s0", "teacher/pi/s0",
              "eval/sft/s1/pi/c0of5", "train/control/s10", "probe/s1/lookup-1/lr3e-05"]
    assert [arms.from_start(u, 0) for u in derived + others] == [True] * 4 + [False] * 6


def test_an_rl_arm_whose_model_is_gone_is_trained_again_only_if_its_eval_is_not_whole(
        tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    held = tmp_path / "held"
    for task in ("t1", "t2"):
        (held / task).mkdir(parents=True)
    args = seed_table.parse(["run", "--state", str(state.root), "--harnesses", "pi",
                             "--eval-temperatures", "0.6"])
    args.heldout_dir = held
    cells = seed_table.arm_cells(args, state, "rl-one", 0)
    ((temperature, (cell,)),) = cells
    assert temperature == 0.6 and cell[0] == "eval/rl-one/s0/pi/c0of1"
    start = seed_table.arm_cells(args, state, "sft", 0)
    assert seed_table.arm_pending(state, "rl-one", 0, cells)  # not trained yet
    assert seed_table.arm_pending(state, "sft", 0, start)  # the start's eval not measured
    state.save("train/rl-one/s0", {"model": str(tmp_path / "gone")})
    state.save(cell[0], {"per_task": {}})
    state.save("eval/sft/s0/pi/c0of1", {"per_task": {}})
    # all measured: the lost model is not needed
    seed_table.set_aside_lost(state, "rl-one", 0, cells)
    assert not seed_table.arm_pending(state, "rl-one", 0, cells)
    assert not seed_table.arm_pending(state, "sft", 0, start)
    assert state.done("train/rl-one/s0") is not None

    args.eval_temperatures = [0.6, 1.0]  # a second temperature: its eval is not whole
    cells = seed_table.arm_cells(args, state, "rl-one", 0)
    seed_table.set_aside_lost(state, "rl-one", 0, cells)
    assert seed_table.arm_pending(state, "rl-one", 0, cells)
    assert state.done("train/rl-one/s0") is None and state.done(cell[0]) is None
    (aside,) = (state.root / "replaced").iterdir()
    assert {p.name for p in (aside / "units").iterdir()} == {
        "train__rl-one__s0.json", "eval__rl-one__s0__pi__c0of1.json"}
    assert "lost with its machine" in (aside / "why.txt").read_text()


def test_run_measures_again_in_the_same_run_what_a_new_start_set_aside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start's evals are all measured, so only the RL arms look pending; building the
    start again sets its evals aside, and the same `run` measures them again."""
    state = State(tmp_path / "state")
    held = tmp_path / "held"
    (held / "t1").mkdir(parents=True)
    (tmp_path / "train").mkdir()
    args = seed_table.parse(["run", "--state", str(state.root), "--harnesses", "pi",
                             "--eval-temperatures", "0.6", "--arms", "sft,rl-one",
                             "--start", "sft"])
    state.save("eval/sft/s0/pi/c0of1", {"per_task": {}, "finished": "2026-12-05T09:00:00Z"})
    served: list[str] = []

    def start_model(args, state, train, seed, base):
        state.replace_runs((), "a new start", finished=["eval/sft/s0/pi/c0of1"])
        return tmp_path / "start"

    def served_evals(args, state, model, label, cells, samples=1, temperature=None):
        for name, _, _ in cells:
            if state.done(name) is None:
                served.append(name)
                state.save(name, {"per_task": {}})

    monkeypatch.setattr(seed_table, "generated", lambda *a: tmp_path)
    monkeypatch.setattr(seed_table, "base_model", lambda a: tmp_path / "base")
    monkeypatch.setattr(seed_table, "seed_tasks", lambda *a: (tmp_path / "train", held))
    monkeypatch.setattr(seed_table, "served_evals", served_evals)
    monkeypatch.setattr(seed_table, "report", lambda *a: None)
    monkeypatch.setattr(arms, "start_model", start_model)
    monkeypatch.setattr(arms, "train_arm", lambda *a: tmp_path / "rl-one")
    seed_table.run(args, state)
    assert served == ["eval/sft/s0/pi/c0of1", "eval/rl-one/s0/pi/c0of1"]
    # all measured (training stands in as done): the start is not asked for again
    state.save("train/rl-one/s0", {"model": str(tmp_path / "rl-one")})
    monkeypatch.setattr(arms, "start_model", lambda *a: pytest.fail("start built"))
    seed_table.run(args, state)


def test_a_run_whose_checkpoints_are_gone_keeps_its_steps_aside_and_starts_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = State(tmp_path / "new", lost_machine(tmp_path))
    args = seed_table.parse(["run", "--state", str(state.root), "--lock", ""])
    args.heldout_dir = tmp_path
    started: list[list[str]] = []

    def child(command, log, every=None):
        started.append(command)
        assert Path(command[command.index("--config") + 1]).is_file()  # not set aside
        run_dir = state.work("train/rl-one/s0")
        (run_dir / "model").mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 1.0}) + "\n")
        return 0

    monkeypatch.setattr(arms, "run_child", child)
    result = arms.rl(args, state, tmp_path, 0, "rl-one", tmp_path / "start", "train/rl-one/s0")
    assert "--resume" not in started[0] and result["resumed"] is False
    (aside,) = (state.root / "replaced").iterdir()
    lost = aside / "progress" / "train__rl-one__s0.metrics.jsonl"
    assert json.loads(lost.read_text()) == {"step": 1, "reward": 0.5}
    assert "checkpoints are" in (aside / "why.txt").read_text()
    kept = state.root / "progress" / "train__rl-one__s0.metrics.jsonl"
    assert json.loads(kept.read_text()) == {"step": 1, "reward": 1.0}  # the new run's


def test_the_report_says_a_start_was_built_again_and_whether_it_is_the_same() -> None:
    import seed_report

    unit = {"rows": 48, "rows_per_harness": {"pi": 48}, "trained_tokens": 4345, "steps": 16,
            "rows_per_step": 4, "lr": 3e-4, "loss_first": 2.47, "loss_last": 0.03,
            "seconds": 60.0, "finished": "2026-12-05T23:54:03Z"}
    first = {"finished": "2026-12-05T02:43:47Z", "rows": 48, "trained_tokens": 4345,
             "max_loss_difference": 0.0031}
    (plain,) = seed_report.training({"sft/s0": unit})
    assert "Built again" not in plain
    (differs,) = seed_report.training({"sft/s0": {**unit, "first_build": first,
                                                  "same_as_first_build": False}})
    assert differs.startswith(plain) and "differ by up to 0.0031; not the same model" in differs
    (same,) = seed_report.training({"sft/s0": {**unit, "same_as_first_build": True,
                                               "first_build": {**first,
                                                               "max_loss_difference": 0.0}}})
    assert same.endswith("differ by up to 0.0000, the same model.")
