#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
cat > 'roman.py' <<'HARNESSRL_EOF'
NUMERALS = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
            (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]


def to_roman(n: int) -> str:
    if not 1 <= n <= 3999:
        raise ValueError(f"{n} is out of range")
    out = []
    for value, numeral in NUMERALS:
        count, n = divmod(n, value)
        out.append(numeral * count)
    return "".join(out)


def from_roman(s: str) -> int:
    table = {numeral: value for value, numeral in NUMERALS}
    total, i = 0, 0
    while i < len(s):
        if s[i:i + 2] in table and len(s[i:i + 2]) == 2:
            total, i = total + table[s[i:i + 2]], i + 2
        elif s[i] in table:
            total, i = total + table[s[i]], i + 1
        else:
            raise ValueError(f"not a roman numeral: {s!r}")
    if not 1 <= total <= 3999 or to_roman(total) != s:
        raise ValueError(f"not a canonical roman numeral: {s!r}")
    return total
HARNESSRL_EOF
