"""Evaluation while training (`[eval]`): every `every_steps` optimizer steps a pass of the
eval harnesses over the held-out tasks, beside the async trainer, which keeps sampling for
training meanwhile (the pass runs on its own `slots`, its own event loop and thread).

Eval rollouts go through the training proxy, so their turns are in the run's one store,
tagged `purpose: eval` (and `eval_step`) in their rollout metadata. They are never trained:
the rollout worker trains only the groups it planned, and an eval rollout is in none. They
take sample numbers from the same counter as training rollouts, so no outcome is written
twice even where the eval set overlaps the training set.

Per harness (`rollout.evaluate`): pass@1 with its Wilson 95% interval, pass@k over the
`samples` per task, tool calls and tokens per solved task, infrastructure errors apart.
Each pass is one line of metrics.jsonl (`{"step": N, "eval": {...}}`), a log of the
trainer's `report_to` backends at step N (`eval/<harness>/pass_at_1`, ...), and a point
per harness of RUN_DIR/eval_pass_rate.png (pass rate against step, with the interval).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.rollout.evaluate import HarnessEval, PlotUnavailable, evaluate
from harnessrl.rollout.runner import Planned, RolloutSettings, Runner, RunSettings
from harnessrl.types import Outcome, Sampling

if TYPE_CHECKING:
    from harnessrl.harnesses.base import Harness
    from harnessrl.rollout.rewards import Shaping
    from harnessrl.rollout.tasks.task import Task
    from harnessrl.train.trl import HarnessRollouts

PURPOSE = "eval"
PLOT_FILE = "eval_pass_rate.png"
# The report_to keys of a pass, per harness: (key, HarnessEval field)
REPORTED = (("pass_at_1", "pass_rate"), ("pass_at_1_ci_low", "ci_low"),
            ("pass_at_1_ci_high", "ci_high"), ("pass_at_k", "pass_at_k"),
            ("tool_calls_per_solved", "tool_calls_per_solved"),
            ("tokens_per_solved", "tokens_per_solved"), ("infra_errors", "infra_errors"),
            ("rollouts", "rollouts"))


@dataclass(frozen=True)
class EvalPass:
    """One finished pass: the step whose end started it and its figures."""

    step: int
    rows: list[HarnessEval]
    seconds: float
    versions: list[str]  # the weight versions that sampled its turns

    def line(self) -> dict[str, Any]:
        return {"step": self.step, "eval": {r.harness: asdict(r) for r in self.rows},
                "eval_seconds": round(self.seconds, 2), "eval_sampled_with": self.versions}

    def logs(self) -> dict[str, float]:
        """For TRL's `log`: `eval_` keys, which report_to backends file under eval/."""
        return {f"eval_{r.harness}/{key}": float(value) for r in self.rows
                for key, name in REPORTED if (value := getattr(r, name)) is not None}


@dataclass
class EvalDuringTraining:
    """Starts passes at their steps (`maybe_start`, from the trainer's thread) and hands
    back the finished ones (`finished`); `wait` waits for the running one."""

    every_steps: int
    tasks: Sequence[Task]
    harnesses: Sequence[Harness]
    samples: int
    settings: RolloutSettings
    sampling: Sampling | None
    shaping: Shaping
    run_dir: Path
    rollouts: HarnessRollouts | None = None  # once the worker has opened it
    on_line: Callable[[dict[str, Any]], None] = lambda _line: None
    _thread: threading.Thread | None = field(default=None, init=False)
    _running: bool = field(default=False, init=False)  # under _lock, with _pending
    _pending: int | None = field(default=None, init=False)
    _done: list[EvalPass] = field(default_factory=list, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    errors: list[str] = field(default_factory=list, init=False)

    def due(self, step: int, last: int | None = None) -> bool:
        """After every `every_steps`-th step, and after the last (`last`, when known)."""
        return self.every_steps > 0 and step > 0 and (step % self.every_steps == 0
                                                      or step == last)

    def maybe_start(self, step: int, last: int | None = None) -> bool:
        """Starts the pass of `step` if one is due; whether it started now. A pass due while
        another runs is queued and starts when that one ends; only the newest queued step
        is kept, so passes slower than `every_steps` never pile up (the one replaced is
        said on stderr)."""
        if not self.due(step, last) or self.rollouts is None:
            return False
        with self._lock:
            if self._running:
                if self._pending is not None:
                    print(f"harnessrl: eval at step {self._pending} skipped: step {step}'s "
                          "pass replaces it in the queue", file=sys.stderr)
                self._pending = step
                return False
            self._running = True
        self._thread = threading.Thread(target=self._passes, args=(step,), daemon=True,
                                         name=f"harnessrl-eval-{step}")
        self._thread.start()
        return True

    def finished(self) -> list[EvalPass]:
        with self._lock:
            done, self._done = self._done, []
        return done

    def wait(self, timeout: float | None = None) -> None:
        """Waits for the running pass and the one queued behind it."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _passes(self, step: int) -> None:
        next_step: int | None = step
        while next_step is not None:
            self._run(next_step)
            with self._lock:  # read and cleared with _running under one lock: none is lost
                next_step, self._pending = self._pending, None
                self._running = next_step is not None

    # ---------------------------------------------------------------- one pass
    def opened(self) -> HarnessRollouts:
        if self.rollouts is None:
            raise RuntimeError("an eval pass needs the rollout worker's rollouts, opened")
        return self.rollouts

    def planned(self) -> list[Planned]:
        return [self.opened().planned_for(h, t.id) for t in self.tasks
                for _ in range(self.samples) for h in self.harnesses]

    def _run(self, step: int) -> None:
        started = time.monotonic()
        try:
            outcomes = asyncio.run(self._rollouts(step))
        except Exception as error:  # a failed pass is reported, never fatal to training
            self.errors.append(f"step {step}: {type(error).__name__}: {error}")
            print(f"harnessrl: the eval pass of step {step} failed: {error}", file=sys.stderr)
            return
        versions = sorted({t.weight_version for o in outcomes if o.rollout
                           for t in self.opened().store.turns(o.rollout) if t.weight_version})
        done = EvalPass(step, evaluate(outcomes, self.samples), time.monotonic() - started,
                        versions)
        self.on_line(done.line())
        with self._lock:
            self._done.append(done)

    async def _rollouts(self, step: int) -> list[Outcome]:
        config = RunSettings(harnesses=self.harnesses, tasks=self.tasks, samples=self.samples,
                           settings=self.settings, shaping=self.shaping)
        rollouts = self.opened()
        # on a cluster the proxies are the nodes' (no gate here): agent timeouts count all
        paused = rollouts.proxy.gate.paused_seconds if rollouts.cluster is None else None
        runner = Runner(config, rollouts.store, rollouts.url, self.run_dir,
                        metadata={"purpose": PURPOSE, "eval_step": step},
                        sampling=self.sampling, paused=paused)
        return await runner.run(self.planned())


# ------------------------------------------------------------------ the plot
def eval_lines(metrics: Path) -> list[dict[str, Any]]:
    if not metrics.exists():
        return []
    lines = []
    for text in metrics.read_text().splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if isinstance(line, dict) and "eval" in line:
            lines.append(line)
    return lines


def plot(metrics: Path, path: Path) -> Path | None:
    """Pass@1 per harness against step, with the 95% interval as a band; None (and a
    note) without matplotlib."""
    lines = eval_lines(metrics)
    try:
        import matplotlib
    except ImportError:
        print(f"harnessrl: {PlotUnavailable.__doc__} ({path.name} skipped)", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[int, float, float, float]]] = {}
    for line in lines:
        for harness, r in line["eval"].items():
            if r.get("pass_rate") is not None:
                series.setdefault(harness, []).append(
                    (line["step"], r["pass_rate"], r["ci_low"], r["ci_high"]))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for harness, points in sorted(series.items()):
        points.sort()
        steps = [p[0] for p in points]
        ax.plot(steps, [p[1] for p in points], marker="o", label=harness)
        ax.fill_between(steps, [p[2] for p in points], [p[3] for p in points], alpha=0.2)
    ax.set_ylim(0, 1)
    ax.set_xlabel("step")
    ax.set_ylabel("pass@1 (95% CI)")
    ax.set_title("eval while training")
    if series:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
