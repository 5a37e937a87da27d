#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
"${PYTHON:-python3}" - <<'PY'
import json
from collections import Counter
statuses, paths = Counter(), Counter()
for line in open("access.log"):
    request, rest = line.split('"')[1], line.split('"')[2].split()
    statuses[rest[0]] += 1
    paths[request.split()[1]] += 1
top = sorted(paths.items(), key=lambda item: (-item[1], item[0]))[0][0]
json.dump({"status_counts": dict(statuses), "top_path": top}, open("report.json", "w"))
PY
