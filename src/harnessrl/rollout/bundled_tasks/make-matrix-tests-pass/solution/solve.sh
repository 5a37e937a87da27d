#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
cat > 'matrix.py' <<'HARNESSRL_EOF'
def transpose(m: list[list[float]]) -> list[list[float]]:
    return [list(col) for col in zip(*m)]


def multiply(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    if any(len(row) != len(b) for row in a):
        raise ValueError("shapes do not fit")
    columns = transpose(b)
    return [[sum(x * y for x, y in zip(row, col)) for col in columns] for row in a]


def determinant(m: list[list[float]]) -> float:
    if len(m) == 1:
        return m[0][0]
    return sum((-1) ** j * m[0][j] * determinant([row[:j] + row[j + 1:] for row in m[1:]])
               for j in range(len(m)))
HARNESSRL_EOF
