#!/usr/bin/env bash
# Reference solution: run in the image's WORKDIR (/code/pkgx).
set -euo pipefail
new="$(semver-bump minor "$(cat VERSION)")"
echo "$new" > VERSION
{ echo "## $new"; echo; cat CHANGELOG.md; } > CHANGELOG.md.new
mv CHANGELOG.md.new CHANGELOG.md
