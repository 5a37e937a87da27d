#!/usr/bin/env bash
# Every 10 minutes: the experiment's records, as mirrored, committed on main (those paths only).
cd "$(dirname "$0")/../.."
while sleep 600; do
  paths="bench/seed_table_46 bench/seed_table_46.md bench/seed_table_46.png bench/seed_table_46_curves.png"
  git add $paths 2>/dev/null
  if ! git diff --cached --quiet -- $paths; then
    git commit -q -m "seed_table_46: records as measured ($(date -u +%H:%M) UTC) (issue 46)" -- $paths
  fi
done
