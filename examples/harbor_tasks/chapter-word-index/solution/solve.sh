#!/usr/bin/env bash
# Reference solution: run in the image's WORKDIR (/data/corpus).
set -euo pipefail
python3 - <<'EOF'
import json, pathlib
counts = {p.name: len(p.read_text().split())
          for p in sorted(pathlib.Path("chapters").glob("*.txt"))}
pathlib.Path("index.json").write_text(json.dumps(counts, indent=2) + "\n")
EOF
