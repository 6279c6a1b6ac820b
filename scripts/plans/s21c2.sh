#!/usr/bin/env bash
# Next session's second call (written in session 20): every GPU op test (the v4flash ones take minutes: CPU
# references), then long contexts (#14 item 7: 64K / 128K at batch 1 / 16, prefilled in 8K chunks), then the 8K
# prefill profile (#15: what bounds it after wo_a's groups).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s21.tar.xz}
source scripts/plans/env.sh
stamp "op tests (all)"
timeout 330 $G/tern_gpu_tests > $OUT/op-tests.log 2>&1; echo "rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/op-tests.log | head -20; grep -E "^\[ RUN" $OUT/op-tests.log | tail -1
stamp "long contexts"
timeout 150 $T bench-step --device cuda --config full --batches 1,16 --contexts 65536,131072 --prefill 65536 \
  --prefill-chunk 8192 --steps 5 --warmup 2 > $OUT/bs-long.log 2>&1; echo "rc $?"
grep -E "state per|^(decode|prefill) |refused|needed" $OUT/bs-long.log | head -12
stamp "8K prefill profile"
timeout 100 $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 8192 --profile \
  --profile-batches 1 --profile-top 30 --steps 3 --warmup 1 > $OUT/prefill-profile.log 2>&1; echo "rc $?"
grep -A45 "profile of the prefill of 8192" $OUT/prefill-profile.log | head -50
stamp done
