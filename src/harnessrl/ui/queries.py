"""Reads behind the trace viewer: every page is one bounded SQL query or a few.

Nothing here loads a run whole. Lists are paginated with LIMIT/OFFSET; per-run summaries
aggregate the `outcomes` table (one row per rollout, never per turn, filtered on its
columns: no JSON is parsed to filter or sort) and read the turns
table only through indexes (`_INDEXES` in the store); a rollout's turns are read a
page at a time, and the chain view reads only the token columns of one rollout.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from harnessrl.store.reader import TraceReader
from harnessrl.store.schema import DB_NAME, migrate
from harnessrl.types import Outcome, Turn

MAX_PAGE = 200
HISTOGRAM_BINS = 10
TOKEN_CACHE = 4  # rollouts whose ids are kept in memory for the tokens page
# SQL expressions over `rollouts r LEFT JOIN outcomes o`: what a rollout row is known by
# before its outcome exists (a running rollout, or an attempt a retry replaced).
_META = "CAST(r.metadata AS TEXT)"
_HARNESS = "COALESCE(o.harness, r.harness)"
_TASK = "COALESCE(o.task, r.task)"
_PASSED = "(o.verifier_reward >= 1)"
_STATE = (f"CASE WHEN o.status = 'done' AND {_PASSED} THEN 'passed' "
          "WHEN o.status = 'done' THEN 'failed' WHEN o.status IS NOT NULL THEN o.status "
          "WHEN r.closed IS NULL THEN 'running' ELSE 'no_outcome' END")
STATES = ("passed", "failed", "infra_error", "running", "no_outcome")


def page_bounds(offset: int, limit: int) -> tuple[int, int]:
    """Clamp a client's paging so that no request reads more than MAX_PAGE rows."""
    return max(0, offset), min(max(1, limit), MAX_PAGE)


@dataclass(frozen=True)
class Filters:
    harness: str | None = None
    task: str | None = None
    state: str | None = None

    def where(self) -> tuple[str, list[Any]]:
        clauses, params = [], []
        if self.harness:
            clauses.append(f"{_HARNESS} = ?")
            params.append(self.harness)
        if self.task:
            clauses.append(f"{_TASK} = ?")
            params.append(self.task)
        if self.state:
            clauses.append(f"({_STATE}) = ?")
            params.append(self.state)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


class RunReader:
    """One run directory's store, read through one connection per thread (a
    `TraceReader`: no thread of its own)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / DB_NAME
        # A store written by an older harnessrl lacks the viewer's indexes or columns:
        # opening it brings it up to date, once. A read-only store of this version still
        # works (only slower if it lacks an index).
        with contextlib.suppress(sqlite3.Error, OSError):
            migrate(self.path)
        self._store = TraceReader(run_dir, up_to_date=True)
        self._atlas: tuple[int, list[dict[str, Any]]] | None = None
        self._lock = threading.Lock()
        self._token_cache: dict[tuple[str, int], list[Turn]] = {}

    @property
    def db(self) -> sqlite3.Connection:
        return self._store.db

    def close(self) -> None:
        self._store.close()

    # ------------------------------------------------------------ the run
    def summary(self) -> dict[str, Any]:
        db = self.db
        models = db.execute("SELECT model, COUNT(*) FROM turns GROUP BY model").fetchall()
        opened, running = db.execute(
            "SELECT COUNT(*), SUM(closed IS NULL) FROM rollouts").fetchone()
        tasks = db.execute(f"SELECT COUNT(DISTINCT {_TASK}) FROM rollouts r "
                           "LEFT JOIN outcomes o ON o.rollout = r.key").fetchone()[0]
        task_names = [r[0] for r in db.execute(
            f"SELECT DISTINCT {_TASK} AS t FROM rollouts r LEFT JOIN outcomes o "
            "ON o.rollout = r.key WHERE t IS NOT NULL ORDER BY t LIMIT 12")]
        return {
            "models": [{"model": m, "turns": n} for m, n in models],
            "turns": sum(n for _, n in models),
            "rollouts": opened, "running": running or 0,
            "outcomes": db.execute("SELECT COUNT(*) FROM outcomes").fetchone()[0],
            "tasks": tasks, "task_names": task_names,
            "harnesses": self.harness_stats(),
            "nodes": self.node_stats(),
        }

    def node_stats(self) -> list[dict[str, Any]]:
        """Per rollout node of a `--cluster ray` run (the node the driver recorded in each
        rollout's metadata): outcomes, passed, infrastructure errors, and the reruns of
        rollouts that lost their node. Empty for a run on one machine."""
        node = f"json_extract({_META}, '$.node')"
        rows = self.db.execute(
            f"SELECT {node} AS n, COUNT(o.rollout), SUM(o.status = 'done'),"
            f" SUM(o.status = 'done' AND {_PASSED}), SUM(o.status != 'done'),"
            f" SUM(json_array_length({_META}, '$.lost_attempts') > 0)"
            " FROM rollouts r LEFT JOIN outcomes o ON o.rollout = r.key"
            " WHERE n IS NOT NULL GROUP BY n ORDER BY n").fetchall()
        return [{"node": n, "outcomes": count, "scored": done or 0, "passed": passed or 0,
                 "infra_errors": errors or 0, "reruns": reruns or 0}
                for n, count, done, passed, errors, reruns in rows]

    def harness_stats(self) -> list[dict[str, Any]]:
        """Per harness, from the outcomes: pass rate among scored rollouts (infrastructure
        errors left out, as in the eval report), tool calls and tokens per solved task."""
        # An outcome scored without a verifier reward (NULL) passes nothing: the SUM of
        # only NULLs is NULL, and the page failed on it.
        rows = self.db.execute(
            "SELECT harness, MAX(harness_version), COUNT(*), SUM(status = 'done'),"
            " COALESCE(SUM(status = 'done' AND verifier_reward >= 1), 0), AVG(reward), MIN(reward),"
            " MAX(reward) FROM outcomes GROUP BY harness ORDER BY harness").fetchall()
        # One reward axis for every harness of the run, 0 and 1 included, so that the
        # small plots compare at a glance.
        low = min([0.0, *(r[6] for r in rows if r[6] is not None)])
        high = max([1.0, *(r[7] for r in rows if r[7] is not None)])
        stats = []
        for harness, version, count, done, passed, mean, _low, _high in rows:
            solved = self.db.execute(
                "SELECT AVG(tool_calls), AVG(completion_tokens) FROM outcomes"
                " WHERE harness = ? AND status = 'done' AND verifier_reward >= 1",
                (harness,)).fetchone()
            stats.append({
                "harness": harness, "version": version, "outcomes": count, "scored": done,
                "passed": passed, "infra_errors": count - done,
                "pass_rate": passed / done if done else None, "mean_reward": mean,
                "tool_calls_per_solved": solved[0], "tokens_per_solved": solved[1],
                "rewards": self.histogram(harness, low, high) if _low is not None else None,
            })
        return stats

    def histogram(self, harness: str, low: float, high: float) -> dict[str, Any]:
        """The harness's reward counts in HISTOGRAM_BINS equal bins from `low` to `high`."""
        width = (high - low) / HISTOGRAM_BINS or 1.0
        counts = [0] * HISTOGRAM_BINS
        for b, n in self.db.execute(
                "SELECT MIN(CAST((reward - ?) / ? AS INTEGER), ?), COUNT(*) FROM outcomes "
                "WHERE harness = ? AND reward IS NOT NULL GROUP BY 1",
                (low, width, HISTOGRAM_BINS - 1, harness)):
            counts[b] = n
        return {"low": low, "high": high, "counts": counts}

    # ------------------------------------------------------------ rollouts
    def rollouts(self, filters: Filters, offset: int = 0, limit: int = 50) -> dict[str, Any]:
        offset, limit = page_bounds(offset, limit)
        where, params = filters.where()
        base = "FROM rollouts r LEFT JOIN outcomes o ON o.rollout = r.key" + where
        total = self.db.execute(f"SELECT COUNT(*) {base}", params).fetchone()[0]
        rows = self.db.execute(
            f"SELECT r.key, r.created, r.closed, {_META}, CAST(o.outcome AS TEXT), {_STATE},"
            " (SELECT COUNT(*) FROM turns t WHERE t.rollout = r.key),"
            " (SELECT COUNT(*) FROM turns t WHERE t.rollout = r.key AND t.status != 'ok')"
            f" {base} ORDER BY r.created DESC, r.key LIMIT ? OFFSET ?",
            [*params, limit, offset]).fetchall()
        return {"total": total, "offset": offset, "limit": limit,
                "rows": [_rollout_row(*row) for row in rows]}

    def facets(self, limit: int = 500) -> dict[str, list[str]]:
        """Harness and task names for the filter boxes (tasks capped: a big task set
        is filtered by typing, not by scrolling a list)."""
        def names(expr: str) -> list[str]:
            return [r[0] for r in self.db.execute(
                f"SELECT DISTINCT {expr} AS v FROM rollouts r LEFT JOIN outcomes o "
                "ON o.rollout = r.key WHERE v IS NOT NULL ORDER BY v LIMIT ?", (limit,))]
        return {"harnesses": names(_HARNESS), "tasks": names(_TASK), "states": list(STATES)}

    def rollout(self, key: str) -> dict[str, Any] | None:
        row = self.db.execute(
            f"SELECT r.key, r.created, r.closed, {_META}, CAST(o.outcome AS TEXT), {_STATE},"
            " (SELECT COUNT(*) FROM turns t WHERE t.rollout = r.key),"
            " (SELECT COUNT(*) FROM turns t WHERE t.rollout = r.key AND t.status != 'ok')"
            " FROM rollouts r LEFT JOIN outcomes o ON o.rollout = r.key WHERE r.key = ?",
            (key,)).fetchone()
        return None if row is None else _rollout_row(*row)

    def siblings(self, key: str, task: str | None, limit: int = 50) -> list[dict[str, Any]]:
        """Other rollouts of the same task, for the compare view."""
        if not task:
            return []
        rows = self.rollouts(Filters(task=task), 0, limit)["rows"]
        return [r for r in rows if r["key"] != key]

    # ------------------------------------------------------------ turns
    def turns(self, key: str, offset: int = 0, limit: int = 20) -> list[Turn]:
        offset, limit = page_bounds(offset, limit)
        return self._store.turns_from(key, offset, limit)

    def turn(self, key: str, index: int) -> Turn | None:
        return self._store.turn(key, index)

    def turn_model(self, key: str, index: int) -> tuple[bool, str | None]:
        """(whether the turn exists, the model it named) without reading its bodies."""
        row = self.db.execute("SELECT model FROM turns WHERE rollout = ? AND idx = ?",
                              (key, index)).fetchone()
        return row is not None, None if row is None else row[0]

    def turn_count(self, key: str) -> int:
        return self.db.execute("SELECT COUNT(*) FROM turns WHERE rollout = ?",
                               (key,)).fetchone()[0]

    def message_turns(self, key: str) -> list[Turn]:
        """The rollout's turns with their canonical requests, for the drift causes of its
        chain breaks (only read when a chain broke)."""
        return self._store.turns(key)

    def atlas(self) -> list[dict[str, Any]]:
        """The run's drift atlas (`rollout.analysis.atlas`): every rollout read once, with its
        messages; kept until the run has more turns."""
        from harnessrl.rollout.analysis.atlas import atlas, atlas_dict

        count = self._store.count_turns()
        with self._lock:
            if self._atlas is not None and self._atlas[0] == count:
                return self._atlas[1]
        found = atlas_dict(atlas(self._store))
        with self._lock:
            self._atlas = (count, found)
        return found

    def token_turns(self, key: str) -> list[Turn]:
        """The rollout's turns with only what chain linking reads (status, flags, ids,
        logprobs): the raw bodies and canonical messages stay on disk. Turns are never
        changed once written, so a rollout's ids are kept for as long as its turn count
        stays the same (a user steps through one rollout's turns)."""
        count = self.turn_count(key)
        with self._lock:
            cached = self._token_cache.get((key, count))
        if cached is not None:
            return cached
        turns = self._store.turns(key, bodies=False)
        with self._lock:
            self._token_cache[(key, count)] = turns
            while len(self._token_cache) > TOKEN_CACHE:
                self._token_cache.pop(next(iter(self._token_cache)))
        return turns


def _rollout_row(key: str, created: float, closed: float | None, metadata: str,
                 outcome: str | None, state: str, turns: int, failed: int) -> dict[str, Any]:
    meta = msgspec.json.decode(metadata) if metadata else {}
    o = msgspec.json.decode(outcome, type=Outcome) if outcome else None
    row: dict[str, Any] = {
        "key": key, "created": created, "closed": closed, "state": state,
        "harness": o.harness if o else meta.get("harness"),
        "task": o.task if o else meta.get("task"),
        "sample": o.sample if o else meta.get("sample"),
        "attempt": meta.get("attempt"), "metadata": meta,
        "turns": turns, "failed_turns": failed,
        # Every field, defaults included (the stored JSON omits them: attempts 1, ...).
        "outcome": msgspec.to_builtins(msgspec.structs.asdict(o)) if o else None,
    }
    return row


def discover(root: Path, depth: int = 2) -> list[Path]:
    """Run directories at or under `root`: those holding a trace store."""
    if (root / DB_NAME).is_file():
        return [root]
    found: list[Path] = []
    if depth > 0 and root.is_dir():
        for child in sorted(p for p in root.iterdir() if p.is_dir()):
            if child.name != "sandboxes":
                found.extend(discover(child, depth - 1))
    return found
