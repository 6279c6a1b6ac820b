#!/usr/bin/env bash
# Session 19, call 2 (warm machine right after call 1): MoE grouped crossover in the model (#14 item 6):
# decode at 128 / 256 with TERN_MOE_GROUPED_MIN_TOKENS=128 against the default 512.
set -u
cd "$(dirname "$0")/../.."
source scripts/plans/env.sh
for m in 128 512; do
  stamp "bench-step 128,256 @1024, TERN_MOE_GROUPED_MIN_TOKENS=$m"
  TERN_MOE_GROUPED_MIN_TOKENS=$m timeout 150 $T bench-step --device cuda --config full --batches 128,256 --contexts 1024 \
    --prefill 1024 --steps 5 --warmup 2 > $OUT/bs-knob$m.log 2>&1; echo "rc $?"
  grep -E "MIN_TOKENS|arena|^\| *(128|256) " $OUT/bs-knob$m.log | tail -8
done
stamp done
