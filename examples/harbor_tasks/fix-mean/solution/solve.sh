#!/usr/bin/env bash
# Reference solution: run in the image's WORKDIR (/workspace/calc).
set -euo pipefail
cat > calc.py <<'EOF'
import calcbase


def mean(values):
    return calcbase.total(values) / len(values) if values else 0.0
EOF
