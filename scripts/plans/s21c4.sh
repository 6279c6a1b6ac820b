#!/usr/bin/env bash
# Session 21's last call: linear_x8 quantising x itself up to 16 tokens (one act_quant launch less per decode FP8
# product: 258 a step). Predicted: batch 1 -0.65 to -0.9 ms (258 launches at ~2.5-3.4 us, the folded hc_post's
# measured price a launch), batch 16 ~-2%, batch 64 unchanged (64-token tiles keep act_quant).
# Pack: scripts/gpu-pack build-cuda; cp build-cuda/gpu-pack.tar.xz .plans/packs/s21b.tar.xz; carry [".plans", ".whl"].
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s21b.tar.xz}
source scripts/plans/env.sh
stamp "op tests: FP8 products (the quantising kernel's bit identity, against the CPU, batch invariance), PDL"
timeout 150 $G/tern_gpu_tests --gtest_filter='Shapes/GpuActFp8Linear.AgainstCpu/*:Shapes/GpuActFp8Linear.GroupedAgainstCpu/*:Shapes/GpuActFp8Linear.BatchInvariant/*:Shapes/GpuActFp8Linear.QuantisingKernelBitIdentical/*:GpuActFp8.Quant*:GpuActFp8.Refuses*:*GpuPdl*:*GpuBasic.Linear*' > $OUT/x8-tests.log 2>&1
echo "rc $?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|differ" $OUT/x8-tests.log | head -20
stamp "decode with and without (same run)"
for q in 1 0 1 0; do
  TERN_X8_QUANT=$q timeout 60 $T bench-step --device cuda --config full --batches 1,16,64 --contexts 1024 --prefill 1024 \
    --steps 20 --warmup 5 > $OUT/x8q-$q.log 2>&1; echo "rc $? (TERN_X8_QUANT=$q)"
  grep -E "^decode " $OUT/x8q-$q.log | head -3
done
stamp "linear rows with and without"
for q in 1 0; do
  TERN_X8_QUANT=$q timeout 60 $G/tern_gpu_bench --only linear > $OUT/linear-$q.log 2>&1; echo "rc $? (TERN_X8_QUANT=$q)"
  grep -E "act-fp8 x8" $OUT/linear-$q.log | grep -E "T=(1|16) " | sed -E 's/ +/ /g' | head -12
done
stamp "batch-1 profile (launches, busy share)"
timeout 60 $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 1024 --profile \
  --profile-batches 1 --profile-top 12 --steps 5 --warmup 2 > $OUT/b1-profile.log 2>&1; echo "rc $?"
grep -E "^\| (attention|indexer|compressor|moe experts|dense gemm|mhc|other|total) |GPU busy|kernel launches" $OUT/b1-profile.log | head -12
stamp "model tests"
timeout 120 $G/tern_gpu_model_tests > $OUT/model-tests.log 2>&1; echo "rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/model-tests.log | head -6
stamp "racecheck and memcheck of the quantising kernel (fixture shapes)"
timeout 100 compute-sanitizer --tool racecheck --print-limit 5 $G/tern_gpu_tests \
  --gtest_filter='Shapes/GpuActFp8Linear.QuantisingKernelBitIdentical/fixture' > $OUT/racecheck.log 2>&1; echo "rc $?"
grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" $OUT/racecheck.log | head -4
timeout 80 compute-sanitizer --tool memcheck --print-limit 5 $G/tern_gpu_tests \
  --gtest_filter='Shapes/GpuActFp8Linear.QuantisingKernelBitIdentical/fixture' > $OUT/memcheck.log 2>&1; echo "rc $?"
grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck.log | head -4
stamp done
