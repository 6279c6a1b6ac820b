#!/usr/bin/env bash
# Session 26, call 6: hc_comb apart up to 8 tokens (pack s26f) against the base (650fe6a, pack s26). Carry [".plans"].
#   1. every model test (HcCombApartChangesNoBits new), every op test (the session's profiler and mHC changes);
#   2. bench-step on the new binary with in-process A/B: TERN_HC_COMB_APART=0 (never) and =1048576 (always) against
#      the default 8, three rounds; then the base binary once for the cross-binary figure.
# Predicted: the default against never: -1.0% at batch 1, 0 at 16 / 64; always against the default: +0.3 / +0.6%
# at 16 / 64.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s26f.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s26.tar.xz build-base
L=$OUT/logs; mkdir -p $L
stamp "1. tests (new)"
timeout 240 $G/tern_gpu_model_tests > $L/model.log 2>&1; echo "rc $?"; pf $L/model.log 8; grep -c "^\[       OK" $L/model.log
timeout 250 $G/tern_gpu_tests > $L/ops.log 2>&1; echo "rc $?"; pf $L/ops.log 12; grep -c "^\[       OK" $L/ops.log
stamp "2. bench-step: new with --ab, then base"
timeout 200 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 --steps 12 --warmup 3 \
  --ab TERN_HC_COMB_APART=0 --ab TERN_HC_COMB_APART=1048576 --ab-rounds 3 > $L/bs-ab.log 2>&1; echo "rc $?"
grep -hE "^(decode|prefill|ab) |A/B|error" $L/bs-ab.log | cut -c1-150 | head -20
timeout 100 build-base/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 \
  --steps 12 --warmup 3 > $L/bs-base.log 2>&1; echo "rc $? (base)"; grep -hE "^(decode|prefill) |error" $L/bs-base.log | cut -c1-110
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
