#!/usr/bin/env bash
# Session 20's second call: moe_bulk's round tag (the shared ring's parity race, cuda-backend.md) on the GPU:
# the MoE op tests (all variants bit-identical, against the CPU), the decode model tests, and the MoE decode rates
# of the old binary (.plans/packs/s20.tar.xz, 2401af0) against the new (s20b) in the same run (predicted: equal
# within noise, one shared load an item); then #15's prefill GEMM rows at 1K / 8K (FP8 library on / off).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s20b.tar.xz}
source scripts/plans/env.sh
mkdir -p /tmp/old && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" .plans/packs/s20.tar.xz /tmp/old
stamp "MoE op tests with the round tag"
timeout 150 $G/tern_gpu_tests --gtest_filter='*Moe*:*ActFp8Linear*:*BatchInvar*' > $OUT/moe-tests.log 2>&1; echo "rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" $OUT/moe-tests.log | head -20
stamp "MoE decode rates: old (2401af0) then new"
timeout 100 /tmp/old/tests/gpu/tern_gpu_bench --only moe > $OUT/moe-old.log 2>&1; echo "rc $?"
timeout 100 $G/tern_gpu_bench --only moe > $OUT/moe-new.log 2>&1; echo "rc $?"
for f in old new; do echo "-- $f"; grep -E "^\| moe" $OUT/moe-$f.log | head -20; done
stamp "bench-step 16,64 new (regression with the tag)"
timeout 120 $T bench-step --device cuda --config full --batches 16,64 --contexts 1024 --steps 10 --warmup 3 > $OUT/bs-tag.log 2>&1; echo "rc $?"
grep -E "^(decode) " $OUT/bs-tag.log | head
for L in 1024 8192; do
  for fp8 in 1 0; do
    stamp "prefill GEMMs at $L, TERN_FP8_LIBRARY=$fp8"
    TERN_FP8_LIBRARY=$fp8 timeout 90 $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill $L \
      --steps 3 --warmup 1 > $OUT/gemm-$L-$fp8.log 2>&1; echo "rc $?"
    grep -E "^prefill |^\| (attn|ffn|routed)" $OUT/gemm-$L-$fp8.log | tail -14
  done
done
stamp done
