"""Reading what a verifier wrote: reward.json or reward.txt in its logs directory, into a
reward and a status (`verify` in task.py), never inventing a score."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

VerdictStatus = Literal["scored", "no_reward", "bad_reward", "timed_out", "not_run"]
# Exit codes of a verifier that could not start what it runs (a shell's "not executable"
# and "not found"; our test runner without pytest).
CANNOT_RUN = frozenset({126, 127})


def read_reward(logs: Path, exit_code: int | None, *, by_exit_code: bool
                ) -> tuple[float, Any, VerdictStatus, str | None]:
    """(reward, reward.json as written, status, why not scored) from the verifier's logs
    directory: reward.json (Harbor reads it first), then reward.txt; without either, by the
    exit code when `by_exit_code` (inline tasks' verify commands), else no score."""
    json_path, txt_path = logs / "reward.json", logs / "reward.txt"
    if json_path.is_file():
        try:
            raw = json.loads(json_path.read_text())
        except ValueError as error:
            return 0.0, None, "bad_reward", f"reward.json is not JSON: {error}"
        reward = _number(raw.get("reward") if isinstance(raw, dict) and "reward" in raw
                         else _single(raw))
        if reward is None:
            return 0.0, raw, "bad_reward", ("reward.json has no numeric 'reward' and is not "
                                            f"a single number: {json_path.read_text()[:200]}")
        return reward, raw, "scored", None
    if txt_path.is_file():
        reward = _number(_float(txt_path.read_text().strip()))
        if reward is None:
            return 0.0, None, "bad_reward", (
                f"reward.txt is not a number: {txt_path.read_text()[:200]!r}")
        return reward, None, "scored", None
    if by_exit_code:
        return (1.0 if exit_code == 0 else 0.0), None, "scored", None
    if exit_code in CANNOT_RUN:
        return 0.0, None, "not_run", (
            f"the verifier could not run what it starts (exit {exit_code}) and wrote no reward")
    return 0.0, None, "no_reward", (
        f"the verifier wrote no reward.txt or reward.json (exit code {exit_code})")


def _single(raw: Any) -> Any:
    if isinstance(raw, dict) and len(raw) == 1:
        return next(iter(raw.values()))
    return raw


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
