#!/usr/bin/env bash
# Issue 46's experiment as it runs on this machine: seed 0's core arms, then seeds 1 and 2
# (SFT start, calibration, core arms). Every unit already recorded is skipped, so this
# goes on from wherever the last session (or machine) stopped:
#   setsid nohup bash bench/seed_table_46/chain.sh >> /work/s46/chain.log 2>&1 &
# src/ is pinned for every recipe-3 arm and seed (a worktree at PIN); bench/ follows main.
set -u
MAIN="$(cd "$(dirname "$0")/../.." && pwd)"
PIN=0f36521
WT=/work/wt/exp
if [ ! -d "$WT" ]; then
  git -C "$MAIN" worktree add --detach "$WT" "$PIN" || exit 1
fi
git -C "$WT" checkout main -- bench
cd "$WT"
export PYTHONPATH="$WT/src"
PY="$MAIN/.venv/bin/python"
REC="--state /work/s46 --record $MAIN/bench/seed_table_46 --out $MAIN/bench/seed_table_46.md --plot $MAIN/bench/seed_table_46.png"
SHARED="--harnesses mini-swe-agent,pi --teacher-harnesses mini-swe-agent,aider,pi --tiers lookup,count,filter --start sft --max-tokens 192 --max-model-calls 6 --agent-timeout 120 --concurrency 4"
SFT="--sft-lr 3e-4 --sft-steps 16 --sft-rows-per-step 4 --teacher-tasks 16 --checkpoint-every 4 --sft-nice"
CAL="--calib-harnesses mini-swe-agent --calib-samples 4 --calib-temperature 1.0 --calib-tiers lookup"
RUN="--steps 30 --group 8 --tasks-per-step 1 --lr 3e-5 --truncated-turns penalty --rejected-turns penalty --max-staleness 1 --queue-maxsize 8 --checkpoint-every 5 --select --band 0.3,0.8 --heldout-sample 40 --eval-samples 4 --eval-temperatures 0.6,1.0 --eval-every 10 --curve-harnesses mini-swe-agent --sft-lr 3e-4 --sft-steps 16 --sft-rows-per-step 4 --teacher-tasks 16"
for SEED in 0 1 2; do
  $PY bench/seed_table.py sft $REC $SHARED $SFT --seeds $SEED || exit 1
  $PY bench/seed_table.py calibrate $REC $SHARED $CAL --seeds $SEED --calib-splits train --calib-per-tier 16 || exit 1
  $PY bench/seed_table.py calibrate $REC $SHARED $CAL --seeds $SEED --calib-splits heldout --calib-per-tier 64 || exit 1
  $PY bench/seed_table.py run $REC $SHARED $RUN --seeds $SEED --arms sft,rl-one,control || exit 1
done
