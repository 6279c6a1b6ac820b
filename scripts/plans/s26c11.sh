#!/usr/bin/env bash
# Session 26, call 11: in-process A/B of the MoE's staged quantisation on the session's code (pack s26i): the batch-1
# trace has the MoE's x and h fake-quant kernels 4.3 + 2.4 us on the path a layer; TERN_MOE_STAGE_QUANT=1 does them in
# the bulk kernels' staging (session 25 call 1: -0.05 / -0.22 / +0.35%, before the side-branch changes). Carry [".plans"].
# Predicted: -1 to -3% at batch 1 if the staging costs the bulk kernels less than the two launches.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s26i.tar.xz
source scripts/plans/env.sh
L=$OUT/logs; mkdir -p $L
timeout 150 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 --steps 12 --warmup 3 \
  --ab TERN_MOE_STAGE_QUANT=1 --ab TERN_MOE_STAGE_QUANT=1,TERN_MOE_EARLY_DOWN=1 --ab-rounds 3 > $L/ab.log 2>&1; echo "rc $?"
grep -hE "^(decode|ab) |error" $L/ab.log | cut -c1-150
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
