#!/usr/bin/env bash
# The main job on the embedded default: SmolLM2-135M on vLLM behind the capture proxy.
set -euo pipefail
source "$(dirname "$0")/bootstrap.sh"
cd "$ROOT"
harnessrl demo "$@"
