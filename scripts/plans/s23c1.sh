#!/usr/bin/env bash
# The next GPU session's first calls (written in session 22; parts a and b ran late in session 22 on an H100,
# results.md). FIRST: PART=a again, for the three tests the session's new defaults broke in their expectations and
# 92389b6 mended without a GPU (GpuModel_.BatchInvariance in the model tests, GpuActFp8Linear.BatchInvariant and
# MoeAgainstCpu below), then the whole tern_gpu_tests once (session 22's filtered run stopped at its limit). Build the pack
# from the HEAD first: ninja -C build-cuda, scripts/gpu-pack build-cuda, cp build-cuda/gpu-pack.tar.xz
# .plans/packs/s23.tar.xz; carry [".plans", ".whl"]. The A/Bs run in one process each (`bench-step --ab`, session 22:
# the model's build, prefill and state clones paid once, the arms alternating B, A on the warm card).
# PART=a (one call, ~8 min): correctness of everything written since session 21's last GPU call, then the decode
#   A/Bs of the MoE changes:
#   0. the model tests (the explicit op context of session 22, the shared expert's output added in the MoE combine,
#      each lane's library GEMMs) and the library / graph op tests;
#   1. the MoE op tests at 1-100 tokens (bulk past 64; MoeVariantsBitIdentical at 100), the shared output added in
#      the combine and joined there (GpuV4.MoeSharedAddedInTheCombine, captured with a side branch), the staged
#      quantisation's bit identity, the PDL chain (w2 copied before the down kernel's wait);
#   2. A/B TERN_MOE_EARLY_DOWN=0 (session 22: w2 copied before the PDL wait; predicted -2 to -6 us a layer at batch
#      1, ~-1% at 16-64) and TERN_MOE_STAGE_QUANT=0 (session 21: 86 launches a step; predicted -0.2 to -0.3 ms at
#      batch 1), batches 1 / 16 / 64; TERN_HC_POST_SQUARES=0 on the 1K / 8K prefill (session 22: the library path's
#      hc_post writes the mix's squares; predicted -10 to -15 ms at 8K; GpuV4.Mhc at 600 tokens holds the bits).
#      (PART=b starts with the MoE rows with the early copy on and off.)
# PART=b (one call): the thresholds:
#   3. the bulk ring against the grouped kernels at 96-256 tokens (--only moe) and decode at 64 / 128 / 256 with the
#      grouped kernels from 129 (arm B) against 65; if B wins at 96 and 128: kMoeGroupedMinTokensDefault = 129;
#   4. linear_x8 quantising x in tiles of 16 (TERN_X8_QUANT_MAX_N=16): tests, then the A/B at 1 / 16;
#   5. the dense products of 65-511 tokens on the library (TERN_DENSE_LIBRARY_MIN_TOKENS=65): the rows, the A/B at
#      64 / 128 / 256 with graphs recording, op and model tests under it;
#   6. batch 1's profile with PDL and the side stream off (each kernel's own duration: what route_scored and moe_plan
#      really take at one token, the next fusions' sizes).
# (#15's serve-bench: s22c2.sh with TERN_PACK=.plans/packs/s23.tar.xz; batch 1 at 1M: s22c3.sh.)
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s23.tar.xz}
source scripts/plans/env.sh
BS="$T bench-step --device cuda --config full --contexts 1024"
grep_ab() { grep -E "^(decode|ab) |^A/B|error" "$1" | cut -c1-200 | head -${2:-12}; }
if [[ ${PART:-a} == a ]]; then
stamp "0. model tests (explicit op context, shared output in the combine, per-lane library GEMMs); library / graph op tests"
timeout 150 $G/tern_gpu_model_tests > $OUT/model-tests.log 2>&1; echo "rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/model-tests.log | head -6
timeout 150 $G/tern_gpu_tests --gtest_filter='*GpuLibrary*fixture*:*GpuFp8Gemm*:*GpuGraphs*' > $OUT/lib-tests.log 2>&1; echo "rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/lib-tests.log | head -6
stamp "1. MoE op tests: 1-100 tokens, shared output in the combine, staged quantisation, PDL chain"
timeout 150 $G/tern_gpu_tests --gtest_filter='Shapes/GpuV4.Mhc/*:Shapes/GpuV4.MoeExperts/*:Shapes/GpuV4.MoeSharedAddedInTheCombine/*:Shapes/GpuV4.MoeVariantsBitIdentical/*:Shapes/GpuActFp8Linear.MoeAgainstCpu/*:Shapes/GpuActFp8Linear.BatchInvariant/*:Shapes/GpuActFp8Linear.QuantisingKernelBitIdentical/*:GpuPdl.DecodeChain*:Shapes/GpuActFp8Linear.MoeStageQuantBitIdentical/*' > $OUT/moe-tests.log 2>&1
echo "rc $?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|changed" $OUT/moe-tests.log | head -12
stamp "2. A/B in one process: w2 before the down kernel's wait off (B1), staged MoE quantisation off (B2), hc_post + squares off (B3)"
# One process, three B arms against A (each arm's graphs recorded again; the prefill rows too): 1K and 8K prefills for
# the squares, batches 1 / 16 / 64 for the MoE switches.
timeout 240 $BS --prefill 1024,8192 --batches 1,16,64 --steps 20 --warmup 5 --ab TERN_MOE_EARLY_DOWN=0 \
  --ab TERN_MOE_STAGE_QUANT=0 --ab TERN_HC_POST_SQUARES=0 --ab-rounds 3 > $OUT/ab-a.log 2>&1
echo "rc $?"; grep_ab $OUT/ab-a.log 24
fi
if [[ ${PART:-a} == b ]]; then
stamp "2b. the MoE rows with w2 copied before the wait (1) and after (0)"
for v in 1 0; do
  TERN_MOE_EARLY_DOWN=$v timeout 60 $G/tern_gpu_bench --only moe > $OUT/moe-early$v.log 2>&1; echo "rc $? (TERN_MOE_EARLY_DOWN=$v)"
  grep -E "^moe_experts .*mxfp4.*T=(1|16|64) " $OUT/moe-early$v.log | grep -E " v0 " | sed -E 's/ +/ /g' | cut -c1-160 | head -4
done
stamp "3. MoE rows up to 256 tokens; decode 64 / 128 / 256: grouped kernels from 129 (B1), dense products on the library from 65 (B2), against A"
timeout 90 $G/tern_gpu_bench --only moe > $OUT/moe.log 2>&1; echo "rc $?"
grep -E "^moe_experts .*T=(64|96|128|192|256) " $OUT/moe.log | grep -E " v0 | v1 |grouped" | sed -E 's/ +/ /g' | cut -c1-190 | head -30
timeout 200 $BS --prefill 1024 --batches 64,128,256 --steps 10 --warmup 3 --ab TERN_MOE_GROUPED_MIN_TOKENS=129 \
  --ab TERN_DENSE_LIBRARY_MIN_TOKENS=65 --ab-rounds 2 > $OUT/ab-b.log 2>&1
echo "rc $?"; grep_ab $OUT/ab-b.log 16
grep -iE "eager" $OUT/ab-b.log | head -3
stamp "4. linear_x8 quantising x in tiles of 16: tests, then the A/B"
TERN_X8_QUANT_MAX_N=16 timeout 60 $G/tern_gpu_tests --gtest_filter='Shapes/GpuActFp8Linear.QuantisingKernelBitIdentical/*:Shapes/GpuActFp8Linear.AgainstCpu/*' > $OUT/x8-16-tests.log 2>&1
echo "rc $?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/x8-16-tests.log
timeout 120 $BS --prefill 1024 --batches 1,16 --steps 20 --warmup 5 --ab TERN_X8_QUANT_MAX_N=16 --ab-rounds 3 > $OUT/ab-x8.log 2>&1
echo "rc $?"; grep_ab $OUT/ab-x8.log 8
stamp "5. dense products of 65-511 tokens on the library: rows, A/B (graphs must record), tests under it"
timeout 90 $G/tern_gpu_bench --only library > $OUT/library.log 2>&1; echo "rc $?"
grep -E "^\| (wq_a|wq_b|wkv|wo_b|shared.w1\|w3|shared.w2) .* \| (64|128|256) \|" $OUT/library.log | head -18
# (its decode A/B ran in item 3's process: ab-b.log)
TERN_DENSE_LIBRARY_MIN_TOKENS=65 timeout 120 $G/tern_gpu_tests --gtest_filter='Shapes/GpuActFp8Linear.AgainstCpu/*:Shapes/GpuActFp8Linear.GroupedAgainstCpu/*:*GpuGraphs*' > $OUT/denselib-tests.log 2>&1
echo "rc $? (op tests, dense products on the library from 65 tokens)"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/denselib-tests.log
stamp "6. batch 1's kernels at their own durations (PDL and the side stream off: no kernel's time includes a wait), top 40"
TERN_PDL=0 TERN_SIDE_STREAM=0 timeout 120 $BS --prefill 1024 --batches 1 --steps 10 --warmup 3 --profile --profile-batches 1 \
  --profile-top 40 > $OUT/profile-b1.log 2>&1; echo "rc $?"
grep -A60 'profile at batch 1,' $OUT/profile-b1.log | head -64
fi
stamp done
