#!/usr/bin/env bash
# Reference solution: run in the image's WORKDIR (/srv/report).
set -euo pipefail
tsvq people.tsv age 18 > adults.tsv
