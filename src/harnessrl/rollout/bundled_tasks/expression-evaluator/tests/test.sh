#!/usr/bin/env bash
# Verifier (Harbor layout): run the hidden pytest suite against the agent's work and write
# the reward. Locations come from the environment, with Harbor's container paths as defaults.
PY="${PYTHON:-python3}"
TESTS_DIR="${TESTS_DIR:-/tests}"
LOGS_DIR="${LOGS_DIR:-/logs/verifier}"
export WORKDIR="${WORKDIR:-$PWD}" PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
mkdir -p "$LOGS_DIR"
if "$PY" -P "$TESTS_DIR/run_tests.py"; then
    echo 1 > "$LOGS_DIR/reward.txt"
else
    echo 0 > "$LOGS_DIR/reward.txt"
fi
