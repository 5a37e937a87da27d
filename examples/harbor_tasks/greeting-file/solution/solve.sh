#!/usr/bin/env bash
# Reference solution: run in the image's WORKDIR (/opt/greeter).
set -euo pipefail
greet world > hello.txt
