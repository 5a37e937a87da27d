#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
"${PYTHON:-python3}" - <<'PY'
import json
groups = {}
for user in json.load(open("users.json")):
    if user["active"]:
        groups.setdefault(user["country"], []).append(user["name"])
out = {country: sorted(names) for country, names in sorted(groups.items())}
json.dump(out, open("by_country.json", "w"), indent=2)
PY
