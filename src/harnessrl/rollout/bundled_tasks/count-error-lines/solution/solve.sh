#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
grep -c 'ERROR' data/app.log > error_count.txt
