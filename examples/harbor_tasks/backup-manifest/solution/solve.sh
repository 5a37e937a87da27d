#!/usr/bin/env bash
# Reference solution: run in the image's WORKDIR (/usr/src/backup).
set -euo pipefail
sed -i 's#list_sizes ./file #list_sizes ./files #' backup.sh
./backup.sh
