#!/usr/bin/env bash
# Reference solution: run in the image's WORKDIR (/srv/ledger).
set -euo pipefail
python3 -c 'import ledgerlib; print(sum(ledgerlib.read("transactions.csv")))' > balance.txt
