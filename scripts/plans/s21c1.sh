#!/usr/bin/env bash
# Next session's first call (written in session 20; build the pack from the HEAD first: ninja -C build-cuda,
# scripts/gpu-pack build-cuda, cp build-cuda/gpu-pack.tar.xz .plans/packs/s21.tar.xz; carry [".plans", ".whl"]).
# Session 20's unrun changes first (wo_a's FP8 groups on side streams: GpuFp8Gemm with 8 groups; the e4m3 grouped MoE
# kernels: TERN_MOE_GROUPED=e4m3 against the CPU and in bench-step; the library rows, cuBLASLt's algorithm sweep), then the decode regression with MTP rounds (the H200's first figures of sessions 18-20
# if an H200 came: session 16's were 8.322 / 23.685 / 53.395 ms), then the decode probe and the MoE rows (on an H200
# the probe is the one run that could reopen the e4m3 MoE decode plan: cuda-backend.md "Measured gaps").
# Ordered by value: a short call still brings the first items back. The v4flash op tests take minutes (CPU references).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s21.tar.xz}
source scripts/plans/env.sh
stamp "FP8 library tests (wo_a's 8 groups on side streams)"
timeout 120 $G/tern_gpu_tests --gtest_filter='*GpuFp8Gemm*:*GpuLibrary*fixture*' > $OUT/fp8-tests.log 2>&1; echo "rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|worst error" $OUT/fp8-tests.log | head -20
stamp "hc_post folded into hc_pre (session 20, never run): the op test, then decode with and without (same run)"
timeout 60 $G/tern_gpu_tests --gtest_filter='Shapes/GpuV4.Mhc/*' > $OUT/mhc-tests.log 2>&1; echo "rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|differs" $OUT/mhc-tests.log | head -8
for fold in 1 0; do
  TERN_HC_FOLD=$fold timeout 60 $T bench-step --device cuda --config full --batches 1,16,64 --contexts 1024 --prefill 1024 \
    --steps 20 --warmup 5 > $OUT/fold-$fold.log 2>&1; echo "rc $? (TERN_HC_FOLD=$fold)"
  grep -E "^decode " $OUT/fold-$fold.log | head -3
done
stamp "the e4m3 grouped MoE kernels (session 20, never run): fold check, against the CPU, then prefill rates"
timeout 150 $G/tern_gpu_tests --gtest_filter='GpuActFp8.E4m3*:Shapes/GpuActFp8Linear.MoeAgainstCpu/*' > $OUT/e4m3-tests.log 2>&1
echo "rc $?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Expected|Which is|max err" $OUT/e4m3-tests.log | head -20
for mode in auto e4m3; do
  TERN_MOE_GROUPED=$mode timeout 90 $T bench-step --device cuda --config full --batches 1 --contexts 1024 \
    --prefill 1024,8192 --steps 3 --warmup 1 > $OUT/moe-$mode.log 2>&1; echo "rc $? ($mode)"
  grep -E "^prefill |routed experts|e4m3|error" $OUT/moe-$mode.log | head -8
done
timeout 120 $G/tern_gpu_bench --only moe_prefill > $OUT/moe-prefill.log 2>&1; echo "rc $?"
grep -E "fp8 activations|wgmma .* TFLOP" $OUT/moe-prefill.log | head -12
stamp "library rows: wo_a grouped against in series, the algorithm sweep"
timeout 150 $G/tern_gpu_bench --only library > $OUT/library.log 2>&1; echo "rc $?"
grep -A12 -E "^wo_a as fp8_block|^cuBLASLt FP8 block-scaled algorithms" $OUT/library.log | head -30
stamp "bench-step decode 1,16,64,128 + prefill 1K/8K + MTP rounds k=3"
timeout 150 $T bench-step --device cuda --config full --batches 1,16,64,128 --contexts 1024 --prefill 1024,8192 \
  --speculative 3 --json $OUT/bs.json > $OUT/bs.log 2>&1; echo "rc $?"
grep -E "arena|^(decode|verify|round|prefill) |threshold|attn.wo_a" $OUT/bs.log | head -30
stamp "decode probe and MoE rows"
timeout 60 $G/tern_gpu_bench --only decode_probe > $OUT/probe.log 2>&1; echo "rc $?"
grep -E "^\| (bytes|bf16|e4m3)|copy band" $OUT/probe.log | head -14
timeout 60 $G/tern_gpu_bench --only moe > $OUT/moe.log 2>&1; echo "rc $?"
grep -E "^moe_experts \((mx|nv)fp4\) v0|^moe_experts grouped" $OUT/moe.log | sed -E 's/ +/ /g' | head -24
stamp "model tests (whole)"
timeout 150 $G/tern_gpu_model_tests > $OUT/model-tests.log 2>&1; echo "rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/model-tests.log | head -10
stamp done
