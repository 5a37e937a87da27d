#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
cat > 'greet.py' <<'HARNESSRL_EOF'
def greet(name: str) -> str:
    return f"Hello, {name.strip() or 'stranger'}!"
HARNESSRL_EOF
