#!/usr/bin/env bash
# Session 26, call 10: the compressor forked before wq_a and hc_comb after the attention's first join (pack s26i)
# against s26h (ca0fd0e: the branch forked after q_norm, hc_comb right after hc_pre). Carry [".plans"].
#   1. model tests (graphs equal eager, greedy, batch invariance, mixed steps);
#   2. bench-step s26h / s26i alternating, three rounds, batch 1 / 16 / 64;
#   3. the new trace at batch 1 (TERN_PROFILE_TRACE) to check the join's wait.
# Predicted: batch 1 -1 to -2% (the CSA layers' branch starts ~6 us earlier and hc_comb leaves its head: 21 layers x
# ~6-10 us of the ~16 us wait), batch 16 -0.5 to -1%, 64 within noise.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s26i.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s26h.tar.xz build-base
L=$OUT/logs; mkdir -p $L
stamp "1. model tests (new)"
timeout 200 $G/tern_gpu_model_tests > $L/model.log 2>&1; echo "rc $?"; pf $L/model.log 8; grep -c "^\[       OK" $L/model.log
stamp "2. bench-step s26h / s26i, three rounds"
for r in 1 2 3; do
  for b in base cuda; do
    timeout 100 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 \
      --steps 12 --warmup 3 > $L/bs-$r-$b.log 2>&1; echo "rc $? ($r $b)"
    grep -hE "^decode |error" $L/bs-$r-$b.log | cut -c1-110
  done
done
stamp "3. trace at batch 1 (new)"
TERN_PROFILE_TRACE=$OUT/trace-new.tsv timeout 80 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 \
  --batches 1 --steps 4 --warmup 3 --profile --profile-batches 1 --profile-top 10 > $L/trace.log 2>&1; echo "rc $?"
gzip $OUT/trace-new.tsv
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
