#!/usr/bin/env bash
# Next session's first call (written in session 21; build the pack from the HEAD first: ninja -C build-cuda,
# scripts/gpu-pack build-cuda, cp build-cuda/gpu-pack.tar.xz .plans/packs/s22.tar.xz; carry [".plans", ".whl"]).
# 0. Each backend lane's own library GEMMs (review mend: concurrent branches of a capture shared one cuBLAS workspace):
#    the model tests and the library / graph op tests.
# 1. Session 21's unrun test changes: the bulk MoE kernels at 100 tokens (GpuV4.MoeExperts expects moe_bulk up to
#    kMoeBulkMaxTokens = 256; MoeVariantsBitIdentical at 100; variant 0 takes jobs of 8 above 64 tokens).
# 2. The bulk ring against the grouped kernels at 96-256 tokens (tern_gpu_bench --only moe now runs the variants up
#    to 256) and whole decode steps at 128 / 256 with the threshold at 65 (default) and 129. Session 21 measured
#    87.9 (bulk, jobs of 8) against 91.8 ms (grouped) at batch 128, 132.1 against 120.3 at 256 (H100). If the bulk
#    kernels win at 96 and 128 here and the tests pass: kMoeGroupedMinTokensDefault = 129 (backend_impl.h).
# 3. linear_x8's in-kernel quantisation at 16 tokens with the prologue's loads in one round (TERN_X8_QUANT_MAX_N=16):
#    if batch 16 gets faster, make 16 the default.
# 4. Dense products of 65-511 tokens on the library (TERN_DENSE_LIBRARY_MIN_TOKENS=65: FP8 on cuBLASLt, bf16 on cuBLAS) against linear_x8's 64-token tiles:
#    if faster with graphs recording, lower the default (the MoE is already not batch invariant from 65).
# 5. The experts' x and h quantised as moe_bulk stages them (TERN_MOE_STAGE_QUANT, 86 launches a step less): the
#    bit-identity test, then batch 1 / 16 / 64 with and without (predicted -0.2 to -0.3 ms at batch 1).
# (#15's serve-bench: s22c2.sh.)
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s22.tar.xz}
source scripts/plans/env.sh
# Two calls (session 22: the whole plan runs past one call's 600 s): PART=a (items 0, 1, 5, 6), then PART=b (2, 3, 4).
# 6. (session 22) The shared expert's output added in the MoE combine (GpuV4.MoeSharedAddedInTheCombine, the model
#    and graph tests) and the bulk down kernel copying w2 before its PDL wait (TERN_MOE_EARLY_DOWN A/B; predicted
#    -2 to -6 us a layer at batch 1, ~-1% at 16-64).
if [[ ${PART:-a} == a ]]; then
stamp "each lane's own library GEMMs (session 21): model tests, library op tests, 8K prefill"
timeout 150 $G/tern_gpu_model_tests > $OUT/model-tests.log 2>&1; echo "rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/model-tests.log | head -6
timeout 150 $G/tern_gpu_tests --gtest_filter='*GpuLibrary*fixture*:*GpuFp8Gemm*:*GpuGraphs*' > $OUT/lib-tests.log 2>&1; echo "rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/lib-tests.log | head -6
stamp "MoE tests at 1-100 tokens (bulk past 64); the shared output added in the combine; PDL chain (w2 copied before the wait)"
timeout 150 $G/tern_gpu_tests --gtest_filter='Shapes/GpuV4.MoeExperts/*:Shapes/GpuV4.MoeSharedAddedInTheCombine/*:Shapes/GpuV4.MoeVariantsBitIdentical/*:Shapes/GpuActFp8Linear.MoeAgainstCpu/fixture:Shapes/GpuActFp8Linear.QuantisingKernelBitIdentical/*:GpuPdl.DecodeChain*:Shapes/GpuActFp8Linear.MoeStageQuantBitIdentical/*' > $OUT/moe-tests.log 2>&1
echo "rc $?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|changed" $OUT/moe-tests.log | head -12
stamp "A/B: w2 copied before the down kernel's wait (TERN_MOE_EARLY_DOWN, session 22); staged quantisation (TERN_MOE_STAGE_QUANT, session 21)"
for v in "TERN_MOE_EARLY_DOWN=1" "TERN_MOE_EARLY_DOWN=0" "TERN_MOE_EARLY_DOWN=1" "TERN_MOE_EARLY_DOWN=0" "TERN_MOE_STAGE_QUANT=0"; do
  env $v timeout 60 $T bench-step --device cuda --config full --batches 1,16,64 --contexts 1024 \
    --prefill 1024 --steps 20 --warmup 5 > $OUT/ab-$v.log 2>&1; echo "rc $? ($v)"
  grep -E "^decode " $OUT/ab-$v.log | cut -d'|' -f2-5
done
for v in 1 0; do
  TERN_MOE_EARLY_DOWN=$v timeout 60 $G/tern_gpu_bench --only moe > $OUT/moe-early$v.log 2>&1; echo "rc $? (TERN_MOE_EARLY_DOWN=$v)"
  grep -E "^moe_experts .*mxfp4.*T=(1|16|64) " $OUT/moe-early$v.log | grep -E " v0 " | sed -E 's/ +/ /g' | cut -c1-160 | head -4
done
fi
if [[ ${PART:-a} == b ]]; then
stamp "MoE rows: bulk (every variant) against grouped up to 256 tokens"
timeout 90 $G/tern_gpu_bench --only moe > $OUT/moe.log 2>&1; echo "rc $?"
grep -E "^moe_experts .*T=(64|96|128|192|256) " $OUT/moe.log | grep -E " v0 | v1 |grouped" | sed -E 's/ +/ /g' | cut -c1-190 | head -30
stamp "decode 128 / 256 and MTP rounds, grouped from 65 (default) against 129"
for g in 65 129; do
  TERN_MOE_GROUPED_MIN_TOKENS=$g timeout 90 $T bench-step --device cuda --config full --batches 1,16,64,128,256 \
    --contexts 1024 --prefill 1024 --steps 10 --warmup 3 --speculative 3 > $OUT/bs-g$g.log 2>&1; echo "rc $? (grouped from $g)"
  grep -E "^(decode|round) " $OUT/bs-g$g.log | cut -d'|' -f1-6 | head -12
done
stamp "linear_x8 quantising x in tiles of 16 with one round of loads (kQ = N, session 21, unmeasured): tests, then A/B"
TERN_X8_QUANT_MAX_N=16 timeout 60 $G/tern_gpu_tests --gtest_filter='Shapes/GpuActFp8Linear.QuantisingKernelBitIdentical/*:Shapes/GpuActFp8Linear.AgainstCpu/*' > $OUT/x8-16-tests.log 2>&1
echo "rc $?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/x8-16-tests.log
for n in 16 8 16 8; do
  TERN_X8_QUANT_MAX_N=$n timeout 60 $T bench-step --device cuda --config full --batches 1,16 --contexts 1024 --prefill 1024 \
    --steps 20 --warmup 5 > $OUT/x8n-$n.log 2>&1; echo "rc $? (TERN_X8_QUANT_MAX_N=$n)"; grep -E "^decode " $OUT/x8n-$n.log | cut -d'|' -f2-5
done
stamp "FP8 products of 128 / 256 tokens: linear_x8's tiles against cuBLASLt (rows, then whole steps: graphs must record)"
timeout 90 $G/tern_gpu_bench --only library > $OUT/library.log 2>&1; echo "rc $?"
grep -E "^\| (wq_a|wq_b|wkv|wo_b|shared.w1\|w3|shared.w2) .* \| (64|128|256) \|" $OUT/library.log | head -18
timeout 120 $G/tern_gpu_bench --only linear > $OUT/linear.log 2>&1; echo "rc $?"
grep -E "act-fp8 x8 .*T=(64|128|256) " $OUT/linear.log | sed -E 's/ +/ /g' | cut -c1-150 | head -24
for m in 65 512; do
  TERN_DENSE_LIBRARY_MIN_TOKENS=$m timeout 90 $T bench-step --device cuda --config full --batches 64,128,256 --contexts 1024 \
    --prefill 1024 --steps 10 --warmup 3 > $OUT/denselib-$m.log 2>&1; echo "rc $? (TERN_DENSE_LIBRARY_MIN_TOKENS=$m)"
  grep -E "^decode |graphs|error|fail" $OUT/denselib-$m.log | cut -c1-200 | head -6
done
TERN_DENSE_LIBRARY_MIN_TOKENS=65 timeout 120 $G/tern_gpu_tests --gtest_filter='Shapes/GpuActFp8Linear.AgainstCpu/*:Shapes/GpuActFp8Linear.GroupedAgainstCpu/*:*GpuGraphs*' > $OUT/denselib-tests.log 2>&1
echo "rc $? (op tests, dense products on the library from 65 tokens)"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/denselib-tests.log
TERN_DENSE_LIBRARY_MIN_TOKENS=65 timeout 120 $G/tern_gpu_model_tests > $OUT/denselib-model.log 2>&1
echo "rc $? (model tests, dense products on the library from 65 tokens)"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/denselib-model.log
fi
stamp done
