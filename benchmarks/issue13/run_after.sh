#!/bin/bash
# usage: run_after.sh SRC OUTPREFIX  (compiled mode only: eager code paths are unchanged by this branch)
SRC=$1; OUT=$2
for s in 1 11 21 31; do
  R=""; [ -f $OUT-s$s/run.json ] && R="--resume"
  PYTHONPATH=$SRC HF_HUB_OFFLINE=1 nice /work/main/.venv/bin/hf-tpu sweep --zoo full --shard $s/40 --modes compiled --jobs 2 $R --out $OUT-s$s --progress lines
done
echo DONE
