#!/usr/bin/env bash
# The main job on the embedded default: SmolLM2-135M on vLLM behind the capture proxy.
set -euo pipefail
# The demo runs in the local sandbox: no Docker daemon or base image to set up for it.
export HARNESSRL_DOCKER="${HARNESSRL_DOCKER:-0}"
# Nor the browser and terminal the tests use (mini-swe-agent runs its commands itself).
export HARNESSRL_SYSTEM_TOOLS="${HARNESSRL_SYSTEM_TOOLS-}"
source "$(dirname "$0")/bootstrap.sh"
cd "$ROOT"
harnessrl demo "$@"
