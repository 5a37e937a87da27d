#!/usr/bin/env python3
"""`bench/rollouts/rollouts.py`, the name issue 16 gives the rollout benchmark: it is
`rollout_overhead.py` (same flags, same report, bench/rollouts/rollouts.md)."""

from __future__ import annotations

from rollout_overhead import main, rows

__all__ = ["main", "rows"]

if __name__ == "__main__":
    main()
