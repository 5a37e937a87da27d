"""A progress line every few seconds while a training run goes, read from its store.

The async trainer runs for minutes between step lines (rollouts sample while the trainer
waits for a batch), and a terminal that prints nothing for that long looks hung. `Live`
reads the run's trace store from a thread of its own, as any other reader does (the WAL
lets it read while the proxy writes), and prints what is going on: rollouts running and
finished, turns and tokens captured, tool calls, the step and the weight version.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from rich.console import Console

from harnessrl.store.reader import TraceReader
from harnessrl.store.schema import DB_NAME
from harnessrl.train.runs.resume import INTERRUPTED
from harnessrl.types import ToolCall, Turn


@dataclass
class Snapshot:
    """What the store says at one moment (counts so far, over the whole run)."""

    running: int = 0
    finished: int = 0
    passed: int = 0
    infra: int = 0
    interrupted: int = 0  # cut by the run's stop and marked when it resumed: not the task's
    turns: int = 0
    sampled: int = 0  # completion tokens the engine sampled
    tool_calls: int = 0  # native tool calls in the replies
    version: str | None = None  # the weight version of the latest turn


@dataclass
class _Seen:
    """Per rollout: how many of its turns were read already, so each poll reads only the
    new ones."""

    turns: int = 0
    sampled: int = 0
    tool_calls: int = 0
    last: tuple[float, str | None] = (0.0, None)  # (received, weight version)


def _tally(seen: _Seen, turn: Turn) -> None:
    seen.turns += 1
    if turn.completion is not None:
        seen.sampled += len(turn.completion.tokens.completion_ids or ())
        seen.tool_calls += sum(isinstance(p, ToolCall) for p in turn.completion.parts)
    # a call never sent to the engine (refused at its step cap, say) names no weights
    if turn.weight_version is not None and turn.timings.received >= seen.last[0]:
        seen.last = (turn.timings.received, turn.weight_version)


@dataclass
class Live:
    """`with Live(run_dir, console, steps=N) as live:` prints a line every `every`
    seconds; pass `live.step` as the trainer's `on_step` to count steps. Without `steps`
    (a run that does not train, such as the demo's oracle check) `title` heads the line."""

    run_dir: Path
    console: Console
    steps: int | None = None
    title: str = "rollouts"
    every: float = 15.0
    clock: Callable[[], float] = time.monotonic
    done_steps: int = 0
    phase: str | None = None  # what the run does now (train.async_grpo.schedule): "sampling", ...
    _seen: dict[str, _Seen] = field(default_factory=dict)
    _reader: TraceReader | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _start: float = 0.0

    def __enter__(self) -> Self:
        self._start = self.clock()
        self._thread = threading.Thread(target=self._loop, name="live-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._reader is not None:
            self._reader.close()

    def step(self, _metrics: dict[str, Any]) -> None:
        self.done_steps += 1

    def set_phase(self, phase: str) -> None:
        """Pass as the trainer's `on_phase`: the line says which phase runs."""
        self.phase = phase

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.console.print(self.line(), highlight=False)

    # ---------------------------------------------------------------- reading
    def snapshot(self) -> Snapshot | None:
        """The store's counts, or None before the proxy has made the store."""
        if self._reader is None:
            if not (self.run_dir / DB_NAME).exists():
                return None
            self._reader = TraceReader(self.run_dir, up_to_date=True)  # the writer migrates
        try:
            return self._read(self._reader)
        except sqlite3.Error:  # the schema is being made: next time
            return None

    def _read(self, store: TraceReader) -> Snapshot:
        outcomes = {o.rollout: o for o in store.outcomes()}
        snap = Snapshot()
        for rollout in store.iter_rollouts():
            seen = self._seen.setdefault(rollout.key, _Seen())
            for turn in store.turns(rollout.key, offset=seen.turns):
                _tally(seen, turn)
            if rollout.key not in outcomes and rollout.closed is None:
                snap.running += 1
        for outcome in outcomes.values():
            snap.finished += 1
            cut = outcome.status != "done" and (outcome.error or "").startswith(INTERRUPTED)
            snap.interrupted += cut
            snap.infra += outcome.status != "done" and not cut
            snap.passed += outcome.status == "done" and (outcome.verifier_reward or 0) >= 1
        seen_all = list(self._seen.values())
        snap.turns = sum(s.turns for s in seen_all)
        snap.sampled = sum(s.sampled for s in seen_all)
        snap.tool_calls = sum(s.tool_calls for s in seen_all)
        snap.version = max(seen_all, key=lambda s: s.last[0]).last[1] if seen_all else None
        return snap

    # ---------------------------------------------------------------- the line
    def line(self) -> str:
        elapsed = int(self.clock() - self._start)
        what = self.title if self.steps is None else f"step {self.done_steps}/{self.steps}"
        head = f"[{elapsed // 60:3d}:{elapsed % 60:02d}] {what}"
        if self.phase is not None:
            head += f" · {self.phase}"
        snap = self.snapshot()
        if snap is None:
            return f"{head} · starting: the model, vLLM and the capture proxy"
        if not snap.finished and not snap.running:
            return f"{head} · no rollout yet" + (": the trainer is loading" if self.steps
                                                  else "")
        infra = f", {snap.infra} infrastructure errors" if snap.infra else ""
        infra += f", {snap.interrupted} interrupted by a restart" if snap.interrupted else ""
        return (f"{head} · rollouts {snap.running} running, {snap.finished} finished "
                f"({snap.passed} passed{infra}) · turns {snap.turns} · tokens sampled "
                f"{snap.sampled:,} · tool calls {snap.tool_calls} · weights "
                f"{snap.version or 'initial'}")
