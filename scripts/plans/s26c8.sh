#!/usr/bin/env bash
# Session 26, call 8: hc_comb placed by the sub-layer (pack s26g: after the attention's first join, in the shared
# expert's branch) against s26f (5196df3: hc_comb forked right after hc_pre, ahead of the compressor / indexer
# branch on the side stream). Carry [".plans"].
#   1. the model tests (graphs equal eager, HcCombApartChangesNoBits, greedy, speculative);
#   2. bench-step s26f / s26g alternating, three rounds, batch 1 / 16 / 64; then s26g with --ab TERN_HC_COMB_APART=0.
# Predicted: batch 1 -0.5 to -1% against s26f (the CSA layers' side branch no longer starts 4.5 us late), 16 / 64
# unchanged (not apart there).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s26g.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s26f.tar.xz build-base
L=$OUT/logs; mkdir -p $L
stamp "1. model tests (new)"
timeout 240 $G/tern_gpu_model_tests > $L/model.log 2>&1; echo "rc $?"; pf $L/model.log 8; grep -c "^\[       OK" $L/model.log
stamp "2. bench-step s26f / s26g, three rounds"
for r in 1 2 3; do
  for b in base cuda; do
    timeout 100 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 \
      --steps 12 --warmup 3 > $L/bs-$r-$b.log 2>&1; echo "rc $? ($r $b)"
    grep -hE "^decode |error" $L/bs-$r-$b.log | cut -c1-110
  done
done
(( $(date +%s) - T0 < 330 )) && { timeout 150 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16 \
  --steps 12 --warmup 3 --ab TERN_HC_COMB_APART=0 --ab-rounds 3 > $L/bs-ab.log 2>&1; echo "rc $?"
  grep -hE "^(decode|ab) |error" $L/bs-ab.log | cut -c1-150; }
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
