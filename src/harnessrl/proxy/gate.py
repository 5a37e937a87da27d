"""The weight gate: while the trainer swaps the engine's weights, new model calls wait
(they are held, not failed) and the swap waits for the calls already running to finish,
so every reply is sampled by one set of weights: the engine's `weight_version` read when
the call is admitted, which its turn records.

The trainer holds the gate from its own thread (`hold`, `release`); model calls pass it on
the proxy's event loop (`admit`, `leave`). The state is a few integers under a
`threading.Lock`, so neither side needs the other's event loop. A held call polls every
`POLL_SECONDS`: holds are rare (one per optimizer step) and short, so a poll is cheaper
than an event loop handoff per call.

The colocated schedule (train/async_grpo/schedule.py) also `close`s the gate while the trainer takes
its optimizer step on the same hardware: new calls wait as during a swap, but the calls
already streaming are not waited for (they finish on their own); `open` lets the held
ones go. A closed gate and a held one are independent: a swap inside a step releases its
hold and the calls still wait for the step's `open`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

POLL_SECONDS = 0.01
# A closed gate holds calls for a whole optimizer step (seconds to minutes): they poll
# less often, so the held calls take next to no CPU from the step.
CLOSED_POLL_SECONDS = 0.1


class GateTimeout(RuntimeError):
    """The calls in flight did not finish in time; the weights were not swapped."""


@dataclass
class WeightGate:
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _drained: threading.Condition = field(init=False, repr=False)
    _held: bool = False
    _closed: bool = False  # the colocated schedule's step (close / open)
    _inflight: int = 0
    _waiting: int = 0
    # Per call that had to wait: seconds it was held (the tests and the metrics read it).
    waits: list[float] = field(default_factory=list)
    holds: int = 0
    # The seconds the gate has been held or closed (`paused_seconds`): what a rollout's
    # agent timeout does not count, as no agent can be blamed for the trainer's time.
    _paused_total: float = 0.0
    _paused_since: float | None = None

    def __post_init__(self) -> None:
        self._drained = threading.Condition(self._lock)

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def waiting(self) -> int:
        """Calls held at the gate right now."""
        return self._waiting

    @property
    def held(self) -> bool:
        return self._held

    @property
    def closed(self) -> bool:
        return self._closed

    def paused_seconds(self) -> float:
        """A clock of the seconds the gate has held or closed new calls so far (weight
        swaps, the colocated schedule's optimizer steps), running while it does: a
        rollout's agent deadline moves by what it advanced during the run
        (`rollout.sandbox.base.finished_within`)."""
        with self._lock:
            running = 0.0 if self._paused_since is None else time.monotonic() - self._paused_since
            return self._paused_total + running

    def _mark(self) -> None:
        """Start or stop the paused clock after a change of `_held` or `_closed` (under
        the lock)."""
        paused, now = self._held or self._closed, time.monotonic()
        if paused and self._paused_since is None:
            self._paused_since = now
        elif not paused and self._paused_since is not None:
            self._paused_total += now - self._paused_since
            self._paused_since = None

    # ---------------------------------------------------------------- model calls
    async def admit(self) -> None:
        """Wait while the gate is held; then count the call as in flight. Pair with
        `leave`. Until then no swap can start, so the weights it sees stay put."""
        started: float | None = None
        try:
            while True:
                with self._lock:
                    if not (self._held or self._closed):
                        self._inflight += 1
                        break
                    if started is None:
                        started = time.monotonic()
                        self._waiting += 1
                    poll = CLOSED_POLL_SECONDS if self._closed else POLL_SECONDS
                await asyncio.sleep(poll)
        finally:
            if started is not None:
                with self._lock:
                    self._waiting -= 1
        if started is not None:
            self.waits.append(time.monotonic() - started)

    def leave(self) -> None:
        with self._drained:
            self._inflight -= 1
            self._drained.notify_all()

    # ---------------------------------------------------------------- the trainer's side
    def hold(self, timeout: float = 600.0) -> None:
        """Stop admitting calls and wait until none is in flight. On timeout the gate
        opens again and `GateTimeout` says how many calls were still running."""
        with self._drained:
            self._held = True
            self.holds += 1
            self._mark()
            if not self._drained.wait_for(lambda: self._inflight == 0, timeout):
                self._held = False
                self._mark()
                raise GateTimeout(f"{self._inflight} model call(s) still running after "
                                  f"{timeout:.0f}s; the weights were not swapped")

    def release(self) -> None:
        """Admit calls again (the held ones first, at their next poll), unless the gate
        is also closed."""
        with self._lock:
            self._held = False
            self._mark()

    def close(self) -> None:
        """Hold new calls from now on, without waiting for the running ones (the
        colocated schedule's optimizer step)."""
        with self._lock:
            self._closed = True
            self._mark()

    def open(self) -> None:
        with self._lock:
            self._closed = False
            self._mark()
