#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs, then runs pytest.
# Extra arguments go to pytest (e.g. `-m "not vllm"` for the fast tier).
set -euo pipefail
source "$(dirname "$0")/bootstrap.sh"
cd "$ROOT"
ruff check src tests bench
pyright -p "$ROOT" --pythonpath "$VENV/bin/python"
python -m pytest "$@"
