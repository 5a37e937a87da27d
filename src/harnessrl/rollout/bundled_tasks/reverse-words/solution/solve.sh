#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
cat > 'text_utils.py' <<'HARNESSRL_EOF'
def reverse_words(text: str) -> str:
    return " ".join(reversed(text.split()))
HARNESSRL_EOF
