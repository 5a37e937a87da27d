"""Scoring a finished GRPO group, with no I/O: its advantages and rows, what becomes of
it (queued, or dropped whole as uniform, stale, untagged or empty), and the metrics it adds
to TRL's sink. `HarnessRolloutWorker` (worker.py) calls these as each group's last rollout
ends; the tests and the benches call them on recorded turns."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from harnessrl.rollout.analysis.chains import link
from harnessrl.train.async_grpo.transfer import version_number
from harnessrl.train.rows.grpo import (
    ChainRow,
    RowSettings,
    chain_rows,
    flagged_turns,
    group_advantages,
    has_spread,
    shuffled,
)
from harnessrl.train.rows.samples import kinded_chains, main_chain, samples_for_rollout
from harnessrl.train.rows.samples import sample as chain_sample
from harnessrl.types import CallKind, Outcome, Sample, Turn


@dataclass(frozen=True)
class Row:
    """One trained sequence of a rollout, and what became of it."""

    rollout: str
    turns: tuple[int, ...]
    input_ids: tuple[int, ...]
    trained_tokens: int
    version: int | None  # None: a turn has no version we set; the row is not trained
    # queued | stale | untagged | uniform (its group had no reward spread)
    fate: str = "queued"
    advantage: float = 0.0
    # replies of the row left out of its loss or penalised: (turn, rejected | truncated)
    flagged: tuple[tuple[int, str], ...] = ()
    kind: str = "rollout"  # rollout | penalty (the row of penalised replies only)
    treatment: str = "train"  # what was done to its flagged replies: mask | penalty | train


@dataclass(frozen=True)
class GroupReport:
    group: int
    harnesses: tuple[str, ...]
    task: str
    outcomes: tuple[Outcome, ...]
    advantages: tuple[float, ...]
    rows: tuple[Row, ...]
    captured_tokens: dict[str, int]  # per rollout key: sampled tokens of its ok turns
    main_chain_tokens: dict[str, int]
    spread: bool = True  # the scored rewards differ
    flagged: dict[str, dict[int, str]] = field(default_factory=dict)  # per rollout


def rows_of(turns: Sequence[Turn], kinds: Collection[CallKind] | None = None,
            harness: str | None = None, *, keep_retried: bool = False) -> list[Sample]:
    """Every chain of the rollout that holds a sampled token and is of one of `kinds`
    (None: every kind; `grpo.call_kinds`), as a sample that says its kind;
    `keep_retried`: `grpo.train_retried`."""
    if not turns:
        return []
    return [s for s in samples_for_rollout(turns, kinds, harness, keep_retried=keep_retried)
            if any(s.mask)]


def captured_tokens(turns: Sequence[Turn]) -> int:
    """Sampled tokens the rollout's finished calls returned (cancelled and failed calls
    are no part of its trajectory)."""
    return sum(len(t.completion.tokens.completion_ids or ()) for t in turns
               if t.status == "ok" and t.completion is not None)


def main_chain_tokens(turns: Sequence[Turn], *, keep_retried: bool = False) -> int:
    chain = main_chain(link(turns, keep_retried=keep_retried).chains) if turns else None
    return 0 if chain is None else sum(chain_sample(chain).mask)


def score_group(group: int, task: str, finished: Sequence[tuple[Outcome, list[Turn]]],
                settings: RowSettings | None = None,
                kinds: Collection[CallKind] | None = None, *, keep_retried: bool = False
                ) -> tuple[GroupReport, list[tuple[Sample, float, Outcome]]]:
    """The group's rows, each with its advantage (its rollout's, or a penalty row's),
    and its report (one `Row` per row, in the same order). `kinds`: the call kinds whose
    chains become rows (`grpo.call_kinds`; None: all); `keep_retried`:
    `grpo.train_retried`."""
    settings = settings or RowSettings()
    rewards = [o.reward if o.status == "done" else None for o, _ in finished]
    adv = group_advantages(rewards, settings.scale_rewards)
    if settings.advantage_control == "shuffle":
        adv = shuffled(adv, rewards, settings.seed, group)
    rows: list[tuple[Sample, float, Outcome]] = []
    reports: list[Row] = []
    flagged: dict[str, dict[int, str]] = {}
    for (outcome, turns), a in zip(finished, adv, strict=True):
        if outcome.status != "done" or not turns:
            continue
        flags = flagged_turns(turns)
        flagged[outcome.rollout] = dict(flags)
        for chain, kind in kinded_chains(turns, kinds, outcome.harness,
                                         keep_retried=keep_retried):
            for r in chain_rows(chain, a, flags, settings, kind):
                rows.append((r.sample, r.advantage, outcome))
                reports.append(_row(r, settings))
    report = GroupReport(
        group=group, harnesses=tuple(o.harness for o, _ in finished), task=task,
        outcomes=tuple(o for o, _ in finished), advantages=tuple(adv),
        rows=tuple(reports),
        captured_tokens={o.rollout: captured_tokens(t) for o, t in finished
                         if o.status == "done"},
        main_chain_tokens={o.rollout: main_chain_tokens(t, keep_retried=keep_retried)
                           for o, t in finished if o.status == "done"},
        spread=has_spread(rewards), flagged=flagged)
    return report, rows


def _row(r: ChainRow, settings: RowSettings) -> Row:
    s = r.sample
    versions = [version_number(v) for v in s.weight_versions]
    version = None if not versions or None in versions else min(
        v for v in versions if v is not None)
    treatment = ("penalty" if r.kind == "penalty" else
                 ",".join(sorted({settings.treatment(f) for _, f in r.flagged})) or "train")
    return Row(s.rollout, s.turns, (*s.prompt_ids, *s.completion_ids), sum(s.mask), version,
               "queued" if version is not None else "untagged", r.advantage,
               r.flagged, r.kind, treatment)


def rollout_sample(s: Sample, advantage: float, version: int, group: int,
                   outcome: Outcome, instruction: str) -> Any:
    """TRL's `RolloutSample`: the mask and logprobs aligned with `input_ids` (0 on the
    prompt and on inserted tokens, which no loss term reads)."""
    import numpy as np

    from harnessrl.train.trl_compat import async_trl

    RolloutSample = async_trl().rollout_sample  # TRL's class
    prompt = len(s.prompt_ids)
    return RolloutSample(
        prompt=[{"role": "user", "content": instruction}], completion=[],
        input_ids=np.asarray([*s.prompt_ids, *s.completion_ids], dtype=np.int64),
        completion_mask=np.asarray([0] * prompt + list(s.mask), dtype=np.int64),
        old_log_probs=np.asarray([0.0] * prompt + s.dense_logprobs(0.0), dtype=np.float32),
        advantage=float(advantage), model_version=version, group_id=group,
        metrics={"reward": float(outcome.reward if outcome.reward is not None else "nan"),
                 "verifier_reward": float(outcome.verifier_reward
                                          if outcome.verifier_reward is not None else "nan")})


def group_metrics(report: GroupReport, current: int) -> dict[str, Any]:
    """One group's metrics in the shape of TRL's sink: floats for counters (`total`) and
    gauges, (numerator, denominator) for rates."""
    out: dict[str, Any] = {"harnessrl/groups_total": 1.0,
                           "harnessrl/infra_errors_total": float(sum(
                               o.status != "done" for o in report.outcomes))}
    by_harness: dict[str, list[Outcome]] = {}
    for o in report.outcomes:
        if o.status == "done":
            by_harness.setdefault(o.harness, []).append(o)
        else:
            _add(out, f"harnessrl/{o.harness}/infra_errors_total", 1.0)
    for harness, outcomes in by_harness.items():
        _add_outcome_rates(out, harness, outcomes)
        keys = {o.rollout for o in outcomes}
        rows = [r for r in report.rows if r.rollout in keys]
        captured = sum(report.captured_tokens[k] for k in keys)
        for prefix in ("harnessrl", f"harnessrl/{harness}"):
            _add(out, f"{prefix}/rows_per_rollout", (len(rows), len(outcomes)))
            _add(out, f"{prefix}/tokens_trained_share",
                 (sum(r.trained_tokens for r in rows), captured))
            _add(out, f"{prefix}/tokens_main_chain_share",
                 (sum(report.main_chain_tokens[k] for k in keys), captured))
    for row in report.rows:
        if row.version is not None:
            _add(out, f"harnessrl/staleness_{current - row.version}_total", 1.0)
        if row.fate != "queued":
            _add(out, f"harnessrl/rows_{row.fate}_dropped_total", 1.0)
    _add_signal(out, report)
    return out


def _add_signal(out: dict[str, Any], report: GroupReport) -> None:
    """Whether the group carried a signal, and what its replies were."""
    fate = report.rows[0].fate if report.rows else "empty"
    _add(out, "harnessrl/groups_with_spread", (float(report.spread), 1.0))
    _add(out, f"harnessrl/groups_{fate}_total", 1.0)
    scored = [a for a, o in zip(report.advantages, report.outcomes, strict=True)
              if o.status == "done"]
    if scored:
        _add(out, "harnessrl/advantage_abs", (sum(abs(a) for a in scored), len(scored)))
        _add(out, "harnessrl/advantage_range", max(scored) - min(scored))
    flags = [f for per in report.flagged.values() for f in per.values()]
    replies = sum(o.turns for o in report.outcomes if o.status == "done")
    for flag in ("rejected", "truncated"):
        _add(out, f"harnessrl/replies_{flag}", (float(flags.count(flag)), replies))
    _add(out, "harnessrl/agent_timeouts_total",
         float(sum(o.agent_timed_out for o in report.outcomes if o.status == "done")))


def group_fate(report: GroupReport, current: int, max_staleness: int,
               drop_uniform: bool) -> str:
    """What becomes of a whole group: queued, or dropped as empty (no row), uniform (no
    reward spread), untagged (a row with no version) or stale (its oldest row is more
    than `max_staleness` versions behind)."""
    versions = [r.version for r in report.rows]
    if not versions:
        return "empty"
    if drop_uniform and not report.spread:
        return "uniform"
    if None in versions:
        return "untagged"
    if current - min(v for v in versions if v is not None) > max_staleness:
        return "stale"
    return "queued"


# What each scored rollout adds per harness, as (sum, count) rates over scored rollouts.
OUTCOME_RATES: dict[str, Callable[[Outcome], float]] = {
    "reward": lambda o: o.reward or 0.0,
    "pass_rate": lambda o: float((o.verifier_reward or 0) >= 1),
    "tool_calls": lambda o: float(o.tool_calls),
    "turns": lambda o: float(o.turns),
    "completion_tokens": lambda o: float(o.completion_tokens),
    # an agent killed at its wall-clock deadline scores as it ended (a 0 if unsolved);
    # counted apart from wrong answers, since a slow engine under load causes them
    "agent_timeouts": lambda o: float(o.agent_timed_out),
}


def _add_outcome_rates(out: dict[str, Any], harness: str, outcomes: list[Outcome]) -> None:
    for name, of in OUTCOME_RATES.items():
        _add(out, f"harnessrl/{harness}/{name}", (sum(of(o) for o in outcomes),
                                                  len(outcomes)))


def _add(out: dict[str, Any], key: str, value: Any) -> None:
    if key not in out:
        out[key] = value
    elif isinstance(value, tuple):
        out[key] = (out[key][0] + value[0], out[key][1] + value[1])
    else:
        out[key] += value


def with_fates(report: GroupReport, fates: list[str]) -> GroupReport:
    rows = tuple(replace(r, fate=f) for r, f in zip(report.rows, fates, strict=True))
    return replace(report, rows=rows)
