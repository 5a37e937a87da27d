#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
{ echo "region,total"; tail -n +2 sales.csv | awk -F, '{t[$2]+=$3} END {for (r in t) print r "," t[r]}' | sort; } > totals.csv
