#!/usr/bin/env bash
# Session 27, call 5 (H200 if one starts; pack s27g = c864d5d, the session's code; carry [".plans"]). Where the
# session's code stands on the H200 (session 26's H200 figures, another call: 7.28 / 23.06 / 51.57 ms): bench-step at
# 1 / 16 / 64 with the in-process arm TERN_MOE_FUSED_PLAN=0 (the one change of the session behind a switch), two rounds.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s27g.tar.xz
source scripts/plans/env.sh
L=$OUT/logs; mkdir -p $L
stamp "bench-step"
timeout 200 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024,8192 --batches 1,16,64 --steps 12 \
  --warmup 3 --ab TERN_MOE_FUSED_PLAN=0 --ab-rounds 2 > $L/bs.log 2>&1; echo "rc $?"
grep -hE "^(decode|prefill|ab|copy) |error|GB/s" $L/bs.log | cut -c1-150 | head -30
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
