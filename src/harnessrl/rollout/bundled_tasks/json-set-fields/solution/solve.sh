#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
"${PYTHON:-python3}" - <<'PY'
import json
config = json.load(open("config.json"))
config.update(debug=True, version="1.2.0")
config["network"]["retries"] = 3
json.dump(config, open("config.json", "w"), indent=2)
PY
