#!/usr/bin/env bash
# Reference solution: run in the image's WORKDIR (/home/dev/service).
set -euo pipefail
sed -i 's/^port = .*/port = 8080/' settings.ini
