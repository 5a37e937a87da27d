#!/usr/bin/env bash
# Verifier (Harbor layout): run the hidden pytest suite against the agent's work and write
# the reward. Locations come from the environment, with Harbor's container paths as defaults.
PY="${PYTHON:-python3}"
TESTS_DIR="${TESTS_DIR:-/tests}"
LOGS_DIR="${LOGS_DIR:-/logs/verifier}"
export WORKDIR="${WORKDIR:-$PWD}" PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
mkdir -p "$LOGS_DIR"
"$PY" -P "$TESTS_DIR/run_tests.py"
code=$?
# 126/127: the interpreter or pytest is missing, so nothing was tested. No reward is
# written: the rollout is an infrastructure error, not a 0.
case $code in
    0) echo 1 > "$LOGS_DIR/reward.txt" ;;
    126|127) echo "the tests could not run (exit $code)" >&2; exit "$code" ;;
    *) echo 0 > "$LOGS_DIR/reward.txt" ;;
esac
