#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
cat > 'fizzbuzz.py' <<'HARNESSRL_EOF'
def fizzbuzz(n: int) -> list[str]:
    out = []
    for i in range(1, n + 1):
        word = ("Fizz" if i % 3 == 0 else "") + ("Buzz" if i % 5 == 0 else "")
        out.append(word or str(i))
    return out
HARNESSRL_EOF
