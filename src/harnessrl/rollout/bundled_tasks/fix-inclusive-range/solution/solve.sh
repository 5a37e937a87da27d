#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
cat > 'ranges.py' <<'HARNESSRL_EOF'
def inclusive_range(start: int, stop: int, step: int = 1) -> list[int]:
    """Numbers from start to stop, both included, moving by step."""
    if step == 0:
        raise ValueError("step must not be zero")
    return list(range(start, stop + (1 if step > 0 else -1), step))
HARNESSRL_EOF
