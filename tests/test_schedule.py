"""The colocated schedule (train/async_grpo/schedule.py) and vLLM's sleep mode
(train/async_grpo/sleep.py).

The sleep mode is tested against a fake vLLM HTTP server (named as such) that answers the
contract `VLLMSleep` is written for: `POST /sleep?level=1`, `POST /wake_up`,
`GET /is_sleeping`; real vLLM's sleep mode needs a GPU, which this machine has not got."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harnessrl.train.async_grpo.schedule import (
    Schedule,
    ScheduleSettings,
    is_colocated,
    sleeps,
    trainer_threads,
)
from harnessrl.train.async_grpo.sleep import VLLMSleep, VLLMSleepError


class FakeVLLM:
    """A fake vLLM server's sleep endpoints: records every request; `fail_wake` answers
    /wake_up with a 500, `stuck` answers it 200 but stays asleep."""

    def __init__(self, *, fail_wake: bool = False, stuck: bool = False,
                 sleep_mode: bool = True) -> None:
        self.requests: list[str] = []
        self.sleeping = False
        self.fail_wake, self.stuck, self.sleep_mode = fail_wake, stuck, sleep_mode

    def answer(self, method: str, path: str) -> tuple[int, dict[str, object]]:
        self.requests.append(f"{method} {path}")
        if not self.sleep_mode:
            return 404, {"detail": "Not Found"}
        if (method, path) == ("POST", "/sleep?level=1"):
            self.sleeping = True
            return 200, {}
        if (method, path) == ("POST", "/wake_up"):
            if self.fail_wake:
                return 500, {"error": "CUDA out of memory"}
            self.sleeping = self.stuck
            return 200, {}
        if (method, path) == ("GET", "/is_sleeping"):
            return 200, {"is_sleeping": self.sleeping}
        return 404, {"detail": "Not Found"}


@contextmanager
def serving(fake: FakeVLLM) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            status, body = fake.answer(self.command, self.path)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _reply

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class RecordingGate:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def close(self) -> None:
        self.log.append("close")

    def open(self) -> None:
        self.log.append("open")

    def hold(self, timeout: float) -> None:
        self.log.append("hold")

    def release(self) -> None:
        self.log.append("release")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------ sleep mode
def test_sleep_then_wake_in_the_contracts_order_on_every_server():
    fakes = [FakeVLLM(), FakeVLLM()]
    with serving(fakes[0]) as one, serving(fakes[1]) as two:
        sleeper = VLLMSleep([one, two + "/"])
        sleeper.sleep()
        assert all(f.sleeping for f in fakes)
        sleeper.wake_up()
    for fake in fakes:
        assert fake.requests == ["POST /sleep?level=1", "GET /is_sleeping",
                                 "POST /wake_up", "GET /is_sleeping"]
        assert not fake.sleeping


def test_a_failed_wake_is_an_error_naming_vllm():
    fake = FakeVLLM(fail_wake=True)
    with serving(fake) as url:
        sleeper = VLLMSleep([url])
        sleeper.sleep()
        with pytest.raises(VLLMSleepError, match=rf"vLLM at {url} did not wake up.*500.*"
                                                 "CUDA out of memory"):
            sleeper.wake_up()


def test_a_wake_that_leaves_vllm_asleep_is_an_error():
    with serving(FakeVLLM(stuck=True)) as url:
        sleeper = VLLMSleep([url])
        sleeper.sleep()
        with pytest.raises(VLLMSleepError, match=r"vLLM at .* still sleeps"):
            sleeper.wake_up()


def test_a_server_without_sleep_mode_is_named_with_the_flag_it_needs():
    with serving(FakeVLLM(sleep_mode=False)) as url, pytest.raises(
            VLLMSleepError, match=r"HTTP 404.*--enable-sleep-mode"):
        VLLMSleep([url]).sleep()


def test_an_unreachable_server_is_an_error_naming_vllm():
    with serving(FakeVLLM()) as url:
        pass  # closed again: nothing listens there now
    with pytest.raises(VLLMSleepError, match=f"vLLM at {url} did not sleep"):
        VLLMSleep([url], timeout=5).sleep()


# ------------------------------------------------------------------ the schedule
def test_a_colocated_step_on_a_gpu_drains_sleeps_and_wakes_before_the_sync():
    """The gate closes, the running calls drain (vLLM cannot sleep under them), vLLM
    sleeps; the sync wakes it before the weights move; the step's end opens the gate."""
    log: list[str] = []
    fake = FakeVLLM()
    with serving(fake) as url:
        schedule = Schedule(colocated=True, step_groups=4, steps=2,
                            gates=[RecordingGate(log)], sleeper=VLLMSleep([url]))
        schedule.step_begin(1)
        assert log == ["close", "hold", "release"] and fake.sleeping
        assert schedule.label() == "training step 1"
        schedule.syncing()
        assert not fake.sleeping and schedule.label() == "syncing weights"
        schedule.step_end()
    assert log[-1] == "open" and schedule.label() == "sampling"
    assert fake.requests == ["POST /sleep?level=1", "GET /is_sleeping",
                             "POST /wake_up", "GET /is_sleeping"]


def test_a_step_without_a_sync_still_wakes_vllm():
    with serving(FakeVLLM()) as url:
        fake_sleeper = VLLMSleep([url])
        schedule = Schedule(colocated=True, step_groups=4, steps=2, sleeper=fake_sleeper)
        schedule.step_begin(1)
        schedule.step_end()  # weight_sync_steps > 1: no sync this step
        assert not fake_sleeper._sleeping(url)


def test_phases_are_timed_and_named_for_the_progress_line():
    clock, seen = Clock(), []
    schedule = Schedule(colocated=False, step_groups=4, steps=2, clock=clock,
                        on_phase=seen.append)
    clock.now = 10.0
    schedule.step_begin(1)
    clock.now = 13.0
    schedule.syncing()
    clock.now = 14.5
    schedule.step_end()
    clock.now = 20.0
    assert schedule.totals() == {"sampling": 15.5, "training": 3.0, "syncing": 1.5}
    assert seen == ["training step 1", "syncing weights", "sampling"]
    schedule.syncing()  # a sync outside a step (the cold one) is no phase
    assert seen[-1] == "sampling"


def test_overlapped_schedule_leaves_the_gates_alone_and_always_wants_rollouts():
    log: list[str] = []
    schedule = Schedule(colocated=False, step_groups=4, steps=1, gates=[RecordingGate(log)])
    schedule.step_begin(1)
    assert schedule.wants_rollouts(100, 100, 3.0)
    schedule.step_end()
    assert log == []


def test_colocated_sampler_plans_only_what_the_next_step_needs():
    schedule = Schedule(colocated=True, step_groups=2, steps=2)  # groups of 4 rollouts
    assert schedule.wants_rollouts(0, 4, 0.25)  # 1 group expected of 2
    assert not schedule.wants_rollouts(0, 8, 0.25)
    assert not schedule.wants_rollouts(1, 4, 0.25)  # 1 queued + 1 expected >= 2
    schedule.step_begin(1)
    assert not schedule.wants_rollouts(0, 0, 0.25)  # nothing starts during a step
    schedule.step_end()
    assert schedule.wants_rollouts(2, 0, 0.25)  # step 2 wants groups 3-4
    assert not schedule.wants_rollouts(3, 4, 0.25)
    schedule.step_begin(2)
    schedule.step_end()
    assert not schedule.wants_rollouts(0, 0, 0.25)  # the last step began: no more


@pytest.mark.parametrize(("setting", "roots", "clustered", "expected"), [
    ("auto", [], False, True),  # vLLM started here
    ("auto", ["http://gpu-box:8000"], False, False),  # an engine elsewhere
    ("auto", [], True, False),  # rollouts on a cluster
    ("on", ["http://gpu-box:8000"], False, True),
    ("off", [], False, False),
])
def test_colocated_by_default_only_when_vllm_is_started_here(setting, roots, clustered,
                                                             expected):
    assert is_colocated(ScheduleSettings(colocated=setting), roots, clustered) is expected


def test_sleep_mode_by_default_only_colocated_on_a_gpu():
    auto = ScheduleSettings()
    assert sleeps(auto, colocated=True, cuda=True)
    assert not sleeps(auto, colocated=True, cuda=False)
    assert not sleeps(auto, colocated=False, cuda=True)
    assert sleeps(ScheduleSettings(sleep="on"), colocated=False, cuda=False)


def test_trainer_threads_per_phase_and_the_override():
    auto = ScheduleSettings()
    assert trainer_threads(auto, colocated=True, local_engine=True, ncores=8) == 8
    # beside a local vLLM that binds all cores but one, the trainer takes the one left
    assert trainer_threads(auto, colocated=False, local_engine=True, ncores=8) == 1
    assert trainer_threads(auto, colocated=False, local_engine=False, ncores=8) == 8
    assert trainer_threads(ScheduleSettings(trainer_threads=3), colocated=True,
                           local_engine=True, ncores=8) == 3


def test_figures_for_the_metrics_line_and_the_summary():
    from collections import Counter

    from harnessrl.train.async_grpo.schedule import figures, summary

    clock = Clock()
    schedule = Schedule(colocated=True, step_groups=4, steps=2, clock=clock)
    clock.now = 60.0
    schedule.step_begin(1)
    clock.now = 90.0
    stats = Counter(rollouts=5, rollouts_started=7, rows_all=9, rows_taken=8)
    line = figures(schedule, stats, 4, {"batch/forwarded_tokens_per_step": 2400.0,
                                        "perf/fwd_bwd_s": 30.0})
    assert line == {"colocated": True,
                    "phase_s": {"sampling": 60.0, "training": 30.0, "syncing": 0.0},
                    "rollouts_started": 7, "rollouts_sampled": 5, "rollouts_trained": 4,
                    "rollouts_trained_share": 0.8, "rows_sampled": 9, "rows_trained": 8,
                    "trainer_tokens_per_s": 80.0}
    assert summary(line) == ("schedule colocated: rollouts trained 4 of 5 finished (80%), "
                             "7 started · seconds sampling 60, training 30, syncing 0 · "
                             "trainer 80 tokens/s in its step")
    empty = figures(schedule, Counter(), 0, {})
    assert empty["rollouts_trained_share"] is None and empty["trainer_tokens_per_s"] is None
