#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
cat > 'duration.py' <<'HARNESSRL_EOF'
import re

PATTERN = re.compile(r"(?:(\d+)d)? *(?:(\d+)h)? *(?:(\d+)m)? *(?:(\d+)s)?")
UNITS = (86400, 3600, 60, 1)


def parse_duration(text: str) -> int:
    match = PATTERN.fullmatch(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise ValueError(f"not a duration: {text!r}")
    return sum(int(part) * unit for part, unit in zip(match.groups(), UNITS) if part)
HARNESSRL_EOF
