#!/usr/bin/env bash
# Verifier (Harbor layout): check.py looks at the agent's files in the image's WORKDIR
# (/usr/src/backup), with the image's own python3 and the package installed at build time.
mkdir -p /logs/verifier
if python3 /tests/check.py; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
