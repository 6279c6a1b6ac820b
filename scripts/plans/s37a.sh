#!/usr/bin/env bash
# Session 37's first call (pack .plans/packs/s37a.tar.xz; carry [".plans/packs/s37a.tar.xz"]): the wgmma MoE kernels
# as 4-block clusters (TERN_MOE_WGMMA_CLUSTER=4: each block loads 4 of a stage's 16 x planes and multicasts them to
# the four) against the default 2-block clusters (session 36 call 4: 8K prefill 0.695-0.698 s, up 3 707-3 712 / down
# 1 946-1 949 us a layer; 2K 0.225-0.226, up 1 735 / down 920). Predicted: the x bytes a block halve again (L2 43% ->
# ~35%), the lockstep of four blocks costs some: up / down -2 to -5% at 8K if the fill is still the bound.
# And hc_pre of prefill chunks on hc_mix_tiled_kernel (TERN_HC_MIX_TILED=1, off; built in session 36 without a GPU):
# predicted ~-20 ms at 8K (hc_post_squares 401 + the library mix 295 us a call -> ~450). And h quantised in the wgmma
# up kernel's epilogue (TERN_MOE_H_QUANT_FOLD=1, off; the same bits as act_fake_quant_bf16_planes_kernel, 178 us a
# layer at 8K): predicted ~-7 ms at 8K (the kernel gone, the up epilogue a few us longer).
#   1. the grouped wgmma tests under 4-block clusters (a hang shows here), GPU model tests with them; GpuV4.Mhc (the
#      tiled mix against the CPU and hc_mix_kernel's bits) and the model tests with TERN_HC_MIX_TILED=1;
#   2. prefill 8K, 4K, 2K, two rounds alternating clusters 2 / 4; 8K and 2K, two rounds, TERN_HC_MIX_TILED 0 / 1;
#   3. ncu of the 8K up kernel with 4-block clusters.
# Also (no new code): the indexer's prefill scores as fp16x3 (TERN_INDEXER_PREFILL=mma-fp16x3, half bf16x6's tensor
# work; session 10 on the H200: 3.02 against 3.25 ms a CSA layer) against the default bf16x6 (2.60 ms a CSA layer at
# 8K in session 36's profile, 7.8% of the prefill), with GpuIndexerMma's accuracy tests (both splits).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s37a.tar.xz
source scripts/plans/env.sh
L=$OUT
P=$(mktemp -d)
stamp "1. tests"
TERN_MOE_WGMMA_CLUSTER=4 timeout 60 $G/tern_gpu_tests --gtest_filter='GpuMoeGroupedWgmma.*' > $P/t-4e.log 2>&1
rc=$?; echo "rc $rc (4, edge shapes)"; pf $P/t-4e.log 6; grep -c "^\[       OK" $P/t-4e.log
mcs="2 4"
if [[ $rc -ne 0 ]]; then mcs="2"; echo "4-block clusters failed or hung: left out below"; fi
if [[ $mcs == "2 4" ]]; then
  TERN_MOE_WGMMA_CLUSTER=4 timeout 150 $G/tern_gpu_tests --gtest_filter='Shapes/GpuMoeGrouped.AgainstCpuAndLibrary/*' \
    > $P/t-4.log 2>&1
  echo "rc $? (4)"; pf $P/t-4.log 6; grep -c "^\[       OK" $P/t-4.log
  TERN_MOE_WGMMA_CLUSTER=4 timeout 150 $G/tern_gpu_model_tests > $P/model.log 2>&1; echo "rc $? (model, 4)"
  pf $P/model.log 4; grep -c "^\[       OK" $P/model.log
fi
timeout 120 $G/tern_gpu_tests --gtest_filter='*GpuV4.Mhc*:*MoeWgmmaHQuantFold*' > $P/t-mhc.log 2>&1
echo "rc $? (mhc)"; pf $P/t-mhc.log 6; grep -c "^\[       OK" $P/t-mhc.log
TERN_HC_MIX_TILED=1 timeout 150 $G/tern_gpu_model_tests > $P/model-t.log 2>&1; echo "rc $? (model, tiled mix)"
pf $P/model-t.log 4; grep -c "^\[       OK" $P/model-t.log
timeout 150 $G/tern_gpu_tests --gtest_filter='*GpuIndexerMma*' > $P/t-idx.log 2>&1
echo "rc $? (indexer, both splits)"; pf $P/t-idx.log 6; grep -c "^\[       OK" $P/t-idx.log
stamp "2. prefill"
rx="moe_grouped_wgmma_kernel"
for r in 1 2; do
  for mc in $mcs; do
    for n in 8192 4096 2048; do pf_rows c$mc-$r $n "$rx" TERN_MOE_WGMMA_CLUSTER=$mc; done
  done
done
for r in 1 2; do
  for tl in 0 1; do
    for n in 8192 2048; do pf_rows t$tl-$r $n "hc_post_squares|hc_mix|sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128" TERN_HC_MIX_TILED=$tl; done
  done
done
for r in 1 2; do
  for hq in 0 1; do pf_rows q$hq-$r 8192 "moe_grouped_wgmma_kernel|act_fake_quant" TERN_MOE_H_QUANT_FOLD=$hq; done
done
for r in 1 2; do
  for ix in mma mma-fp16x3; do pf_rows i$ix-$r 8192 "indexer_mma" TERN_INDEXER_PREFILL=$ix; done
done
stamp "3. ncu of the 8K up kernel, 4-block clusters"
if [[ $mcs == "2 4" ]]; then ncu_prefill c4 moe_grouped_wgmma_kernel TERN_MOE_WGMMA_CLUSTER=4; fi
# Every log back in one file (the output tail keeps the last 12 000 characters only).
tar czf $L/logs.tgz -C $P --exclude='*.ncu-rep' .
stamp done
