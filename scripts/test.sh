#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs, then runs pytest.
# Extra arguments go to pytest (e.g. `-m "not vllm"` for the fast tier).
set -euo pipefail
source "$(dirname "$0")/bootstrap.sh"
cd "$ROOT"
ruff check src tests bench
pyright -p "$ROOT" --pythonpath "$VENV/bin/python"
# The docs site, strict: a broken link, a page that fails to generate or a missing
# include fails the run. Also writes site/llms.txt (tests/test_docs.py checks the pages).
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet
python -m pytest "$@"
