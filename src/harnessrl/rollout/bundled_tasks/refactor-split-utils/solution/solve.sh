#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
mkdir -p 'utils'
cat > 'utils/__init__.py' <<'HARNESSRL_EOF'
"""Helpers used all over the project."""

from utils.numbers import clamp, mean
from utils.strings import slug, title

__all__ = ["clamp", "mean", "slug", "title"]
HARNESSRL_EOF
mkdir -p 'utils'
cat > 'utils/strings.py' <<'HARNESSRL_EOF'
def slug(text: str) -> str:
    return "-".join(text.lower().split())


def title(text: str) -> str:
    return " ".join(word.capitalize() for word in text.split())
HARNESSRL_EOF
mkdir -p 'utils'
cat > 'utils/numbers.py' <<'HARNESSRL_EOF'
def clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


def mean(values: list[float]) -> float:
    return sum(values) / len(values)
HARNESSRL_EOF
rm -f utils.py
