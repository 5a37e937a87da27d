#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
cat > 'palindrome.py' <<'HARNESSRL_EOF'
def is_palindrome(text: str) -> bool:
    kept = [c.lower() for c in text if c.isalnum()]
    return kept == kept[::-1]
HARNESSRL_EOF
