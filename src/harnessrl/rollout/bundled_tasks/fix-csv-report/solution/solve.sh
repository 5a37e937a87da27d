#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
mkdir -p 'report'
cat > 'report/parse.py' <<'HARNESSRL_EOF'
import csv


def read_rows(path: str) -> list[dict]:
    with open(path, newline="") as handle:
        return [dict(row, salary=int(row["salary"])) for row in csv.DictReader(handle)]
HARNESSRL_EOF
mkdir -p 'report'
cat > 'report/summary.py' <<'HARNESSRL_EOF'
def summarize(rows: list[dict]) -> dict[str, dict]:
    groups: dict[str, list[int]] = {}
    for row in rows:
        groups.setdefault(row["department"], []).append(row["salary"])
    return {
        department: {"count": len(salaries),
                     "average": round(sum(salaries) / len(salaries), 2),
                     "max": max(salaries)}
        for department, salaries in groups.items()
    }
HARNESSRL_EOF
