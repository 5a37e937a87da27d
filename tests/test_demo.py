"""The demo: its embedded config (everything it names exists, its shaping gives GRPO a
signal when the whole group fails), the live progress it prints while it trains, the turn
it chooses to show, and the demo itself on the tiny model (the run is the README's main-job
command)."""

from __future__ import annotations

import asyncio
import io
import itertools
import re
import threading
import time
from pathlib import Path
from typing import Literal

import pytest
from rich.console import Console

from harnessrl.demo import Chosen, brevity, choose_turn, demo_config
from harnessrl.harnesses import get
from harnessrl.rollout.rewards import TraceStats
from harnessrl.rollout.tasks.task import Verdict, load_tasks
from harnessrl.store.writer import TraceStore
from harnessrl.train.live import Live
from harnessrl.types import (
    ChatRequest,
    Completion,
    Message,
    Outcome,
    Rollout,
    Text,
    Timings,
    Tokens,
    ToolCall,
    ToolResult,
    Turn,
)

PROGRESS = re.compile(r"^\[\s*\d+:\d\d\] step (\d+)/(\d+) · ")


def test_demo_config_names_real_tasks_harnesses_and_terms(tmp_path: Path) -> None:
    config = demo_config(tmp_path, None)
    tasks = load_tasks(config.rollout.tasks)
    assert len(tasks) >= config.grpo.tasks_per_step
    assert [get(name).name for name in config.rollout.harnesses] == ["mini-swe-agent"]
    assert config.model.path == "smollm2" and config.grpo.steps == 2
    assert set(config.shaping.custom_terms) == {"brevity"}


def test_many_rollouts_are_shown_by_task_and_weights() -> None:
    from harnessrl.demo import _rollout_table

    outcomes = [Outcome(harness="h", harness_version="1", task=f"t{i % 2}", sample=i,
                        rollout=f"r{i}", status="done" if i else "infra_error",
                        reward=None if i == 0 else -0.01 * i, verifier_reward=0.0, turns=3,
                        completion_tokens=100) for i in range(20)]
    turns = {o.rollout: [msgspec_replace(t, rollout=o.rollout,
                                         weight_version="v1" if int(o.rollout[1:]) < 10
                                         else "v2") for t in _tool_rollout()]
             for o in outcomes}
    out = io.StringIO()
    Console(file=out, width=200).print(_rollout_table(outcomes, turns))
    text = out.getvalue()
    assert "20 rollouts, by task" in text and text.count("│ h ") == 4  # 2 tasks x 2 versions
    assert "-0.18..-0.10" in text  # t0 with v2: samples 10, 12, .., 18
    few = io.StringIO()
    Console(file=few, width=200).print(_rollout_table(outcomes[:3], turns))
    assert few.getvalue().count("│ h ") == 3


def test_failed_rollouts_of_different_length_get_different_rewards() -> None:
    shaping = demo_config(Path("unused"), None).shaping
    failed = Verdict(reward=0.0, passed=False, output="1 failed", seconds=1.0)
    short, long = (shaping.reward(failed, TraceStats(turns=2, tool_calls=0,
                                                     completion_tokens=n))[0]
                   for n in (100, 900))
    assert short > long and short == brevity(failed, TraceStats(2, 0, 100))


# ------------------------------------------------------------------ turns to choose from
def _turn(key: str, index: int, given: tuple, reply: tuple, prompt: tuple[int, ...],
          completion: tuple[int, ...]) -> Turn:
    tokens = Tokens(prompt, completion, tuple(-0.5 for _ in completion))
    return Turn(rollout=key, index=index, dialect="openai_chat", status="ok",
                timings=Timings(float(index)), raw_request=b"{}",
                request=ChatRequest(model="m", messages=given),
                completion=Completion("m", reply, "stop", None, tokens), weight_version="v1")


ERROR = "Please always provide EXACTLY ONE action in triple backticks."


def _echo_rollout() -> list[Turn]:
    """A small model's rollout: the second reply repeats the harness's format error."""
    user = (Message("user", (Text("make hello.txt"),)),)
    told = (*user, Message("user", (Text(ERROR),)))
    return [_turn("echo", 0, user, (Text("I think so"),), (1, 2), (3, 4, 5)),
            _turn("echo", 1, told, (Text(ERROR),), (9, 9), (3, 4, 5, 6, 7, 8))]


def _tool_rollout() -> list[Turn]:
    user = (Message("user", (Text("make hello.txt"),)),)
    call = ToolCall("c1", "bash", '{"command": "echo hi > hello.txt"}')
    back = (*user, Message("assistant", (call,)),
            Message("tool", (ToolResult("c1", (Text("returncode 0"),)),)))
    return [_turn("tool", 0, user, (call,), (1, 2), (3,)),
            _turn("tool", 1, back, (Text("done"),), (1, 2, 3, 50), (4,))]


def test_a_tool_call_the_harness_ran_is_chosen_over_longer_replies() -> None:
    chosen = choose_turn({"echo": _echo_rollout(), "tool": _tool_rollout()}, [])
    assert isinstance(chosen, Chosen) and chosen.turn.rollout == "tool"
    assert chosen.turn.index == 0 and chosen.call is not None and chosen.call.name == "bash"
    assert chosen.result == "returncode 0" and "tool call the harness ran" in chosen.why


def test_without_a_tool_call_a_reply_that_echoes_the_harness_is_not_chosen() -> None:
    chosen = choose_turn({"echo": _echo_rollout()}, [])
    assert chosen is not None and chosen.turn.index == 0  # shorter, but not an echo
    assert "does not repeat the message it answered" in chosen.why
    only_echo = choose_turn({"echo": _echo_rollout()[1:]}, [])
    assert only_echo is not None and "every reply repeated" in only_echo.why


def test_a_passed_rollout_is_preferred_among_equals() -> None:
    other = _tool_rollout()
    passed = Outcome(harness="h", harness_version="1", task="t", sample=0, rollout="tool2",
                     status="done", reward=1.0, verifier_reward=1.0)
    renamed = [msgspec_replace(t, rollout="tool2") for t in _tool_rollout()]
    chosen = choose_turn({"tool": other, "tool2": renamed}, [passed])
    assert chosen is not None and chosen.turn.rollout == "tool2"
    assert "verifier passed" in chosen.why


def msgspec_replace(turn: Turn, **changes: object) -> Turn:
    import msgspec

    return msgspec.structs.replace(turn, **changes)


# ------------------------------------------------------------------ the live progress
class Stamped(io.StringIO):
    """A console file that remembers when each line was written."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            now = time.monotonic()
            self.lines += [(now, line) for line in text.splitlines() if line.strip()]
            return super().write(text)


def test_live_progress_counts_rollouts_turns_tokens_and_steps(tmp_path: Path) -> None:
    out = Stamped()
    live = Live(tmp_path, Console(file=out, width=200), steps=2, every=0.05)
    assert "starting" in live.line()  # no store yet
    oracle = Live(tmp_path, Console(file=io.StringIO()), title="oracle check")
    assert "] oracle check · starting" in oracle.line()
    store = TraceStore(tmp_path)

    async def write() -> None:
        for key in ("a", "b"):
            await store.put_rollout(Rollout(key, 1.0, metadata={"harness": "h", "task": "t"}))
        for turn in _tool_rollout():
            await store.add_turn(msgspec_replace(turn, rollout="a"))
        await store.put_outcome(Outcome(harness="h", harness_version="1", task="t", sample=0,
                                        rollout="a", status="done", reward=1.0,
                                        verifier_reward=1.0))

    with live:
        asyncio.run(write())
        live.step({})
        deadline = time.monotonic() + 10
        while not any("step 1/2" in line and "1 finished" in line for _, line in out.lines) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
    store.close()
    last = out.lines[-1][1]
    assert PROGRESS.match(last) and "step 1/2" in last, last
    assert "rollouts 1 running, 1 finished (1 passed)" in last
    assert "turns 2 · tokens sampled 2 · tool calls 1 · weights v1" in last


def test_rollouts_cut_by_a_restart_are_not_called_infrastructure_errors(tmp_path: Path
                                                                       ) -> None:
    """A resumed run marks the rollouts its stop cut as `infra_error` outcomes ("interrupted:
    ..."): never scored, but not the sandbox's or the engine's failure either, so the line
    counts them apart."""
    from harnessrl.train.runs.resume import INTERRUPTED

    store = TraceStore(tmp_path)

    ends: list[tuple[Literal["done", "infra_error"], str | None]] = [
        ("infra_error", f"{INTERRUPTED}: the run stopped"),
        ("infra_error", "sandbox: docker exited 125"), ("done", None)]

    async def write() -> None:
        for sample, (status, error) in enumerate(ends):
            key = f"r{sample}"
            await store.put_rollout(Rollout(key, 1.0, metadata={"harness": "h", "task": "t"}))
            await store.put_outcome(Outcome(harness="h", harness_version="1", task="t",
                                            sample=sample, rollout=key, status=status,
                                            error=error))

    asyncio.run(write())
    line = Live(tmp_path, Console(file=io.StringIO()), steps=2).line()
    store.close()
    assert "3 finished (0 passed, 1 infrastructure errors, 1 interrupted by a restart)" in line


def test_the_weights_shown_are_the_last_sampled_turns_not_an_unsent_call() -> None:
    """A call refused at the rollout's step cap was never sent to the engine and names no
    weights: the line keeps the version of the last sampled turn, not "initial"."""
    from harnessrl.train.live import _Seen, _tally

    sampled = msgspec_replace(_tool_rollout()[-1], weight_version="v3")
    refused = msgspec_replace(sampled, index=sampled.index + 1, weight_version=None,
                              timings=msgspec_replace(sampled.timings,
                                                      received=sampled.timings.received + 5))
    seen = _Seen()
    for turn in (sampled, refused):
        _tally(seen, turn)
    assert seen.last == (sampled.timings.received, "v3") and seen.turns == 2


def test_live_progress_names_the_phase_the_schedule_reports(tmp_path: Path) -> None:
    live = Live(tmp_path, Console(file=io.StringIO()), steps=2)
    assert " · starting" in live.line() and "sampling" not in live.line()
    live.step({})
    live.set_phase("training step 2")  # what train(on_phase=...) passes
    assert "] step 1/2 · training step 2 · starting" in live.line()
    live.set_phase("syncing weights")
    assert "step 1/2 · syncing weights ·" in live.line()


# ------------------------------------------------------------------ the demo itself
@pytest.mark.vllm
@pytest.mark.harness
@pytest.mark.slow
def test_the_demo_shows_progress_while_it_trains(vllm_tiny, tiny_model, tmp_path: Path):
    from harnessrl.demo import run_demo

    out = Stamped()
    code = run_demo(tmp_path, model=str(tiny_model), steps=1, every=2.0,
                    console=Console(file=out, width=150), engine_url=vllm_tiny.url)
    text = "\n".join(line for _, line in out.lines)
    assert code == 0, text
    start = next(i for i, (_, line) in enumerate(out.lines) if line.startswith("training:"))
    step = next(i for i, (_, line) in enumerate(out.lines) if line.startswith("step 1:"))
    progress = [line for _, line in out.lines[start:step] if PROGRESS.match(line)]
    # while it trained: rollouts were seen running, then turns and tokens captured
    assert any("running" in line for line in progress), text
    assert any(re.search(r"turns [1-9]", line) for line in progress), text
    stamps = [t for t, _ in out.lines[start:step + 1]]
    assert max(b - a for a, b in itertools.pairwise(stamps)) < 30, text
    assert "one captured turn, chosen as" in text
