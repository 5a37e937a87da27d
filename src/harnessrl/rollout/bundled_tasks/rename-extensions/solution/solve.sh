#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
for f in docs/*.txt; do mv "$f" "${f%.txt}.md"; done
