#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
cat > 'temperature.py' <<'HARNESSRL_EOF'
def c_to_f(celsius: float) -> float:
    if celsius < -273.15:
        raise ValueError("below absolute zero")
    return round(celsius * 9 / 5 + 32, 2)


def f_to_c(fahrenheit: float) -> float:
    if fahrenheit < -459.67:
        raise ValueError("below absolute zero")
    return round((fahrenheit - 32) * 5 / 9, 2)
HARNESSRL_EOF
