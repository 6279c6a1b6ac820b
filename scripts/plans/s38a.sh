#!/usr/bin/env bash
# Session 38's first call (pack .plans/packs/s38a.tar.xz; carry [".plans/packs/s38a.tar.xz"]; S38A_END = seconds the
# optional steps must end by, default 520). Session 37 (results.md) ran the rebuilt e4m3 grouped MoE kernels once:
# correct, 0.82x the bf16 kernels at 8K, the producer the bound (ncu: its thread-a-row FP4 copies 49% excess L2 sectors,
# 46% excess shared wavefronts). Since: the copies 4 threads a row (a warp writes 8 whole rows) and a producer barrier
# before the decode reads them. Predicted: the 1K-2K kernels (weight streaming) toward the bf16 kernels' copy rate; at 8K
# the stage's ~2 240 cycles fall if the copies' latency was the bound, not if the decode's issue is.
#   1. the e4m3 tests; the GPU model tests (session 37 removed the tiled mix, the up-epilogue h quantisation and
#      4-block clusters: the default paths must be untouched);
#   2. e4m3 against the bf16 kernels, 8K / 2K, two rounds; the MoE bench;
#   3. ncu of the e4m3 up kernel at 8K and 128 pairs (not the 1K context's launch, as in session 37);
#   4. the indexer's fp16x3 scores, a second round at 8K, and GpuIndexerMma's tests (both splits);
#   5. the bf16 wgmma kernels' scale groups (TERN_MOE_SCALE_GROUPS=1: a row's scales 16 bytes every 4 stages; built at
#      session 37's end): its bit-identity test, then 8K off / on. Predicted -1 to -3% on the up / down kernels.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s38a.tar.xz
source scripts/plans/env.sh
L=$OUT
P=$(mktemp -d)
el() { echo $(( $(date +%s) - T0 )); }
END=${S38A_END:-520}
stamp "1. tests"
timeout 150 $G/tern_gpu_tests --gtest_filter='*E4m3*:*GpuActFp8Linear.MoeAgainstCpu*' > $P/t-e4.log 2>&1
e4rc=$?; echo "rc $e4rc (e4m3)"; pf $P/t-e4.log 10; grep -c "^\[       OK" $P/t-e4.log
timeout 60 $G/tern_gpu_tests --gtest_filter='*ScaleGroupsBitIdentical*' > $P/t-sg.log 2>&1
echo "rc $? (scale groups)"; pf $P/t-sg.log 6
if [[ $END -ge 400 ]]; then
  timeout 150 $G/tern_gpu_model_tests > $P/model.log 2>&1; echo "rc $? (model)"; pf $P/model.log 4
  grep -c "^\[       OK" $P/model.log
fi
rx="moe_grouped_(wgmma|e4m3)_kernel|moe_e4m3|act_fake_quant"
if [[ $e4rc -eq 0 ]]; then
  stamp "2. e4m3 against the bf16 wgmma kernels"
  for r in 1 2; do
    if [[ $r == 2 && $(el) -gt $((END - 200)) ]]; then break; fi
    for k in auto e4m3; do
      for n in 8192 2048; do pf_rows k$k-$r $n "$rx" TERN_MOE_GROUPED=$k; done
    done
  done
  if [[ $(el) -lt $((END - 150)) ]]; then
    timeout 60 $G/tern_gpu_bench --only moe_prefill > $P/bench-moe.log 2>&1; echo "rc $? (bench)"
    grep -E "fp8 activations: wgmma" $P/bench-moe.log | head -6 | cut -c1-160
  fi
  stamp "3. ncu of the e4m3 up kernel, 8K, 128 pairs"
  if [[ $(el) -lt $((END - 110)) ]]; then ncu_prefill e4 "moe_grouped_e4m3_kernel<.*128" TERN_MOE_GROUPED=e4m3; fi
fi
stamp "4. the indexer's fp16x3 scores"
if [[ $(el) -lt $((END - 60)) ]]; then
  timeout 60 $G/tern_gpu_tests --gtest_filter='*GpuIndexerMma*' > $P/t-idx.log 2>&1
  echo "rc $? (indexer, both splits)"; pf $P/t-idx.log 6; grep -c "^\[       OK" $P/t-idx.log
fi
if [[ $(el) -lt $((END - 30)) ]]; then
  for ix in mma mma-fp16x3; do pf_rows i$ix 8192 "indexer_mma" TERN_INDEXER_PREFILL=$ix; done
fi
stamp "5. scale groups"
if [[ $(el) -lt $((END - 25)) ]] && grep -q "OK \] GpuMoeGroupedWgmma.ScaleGroupsBitIdentical" $P/t-sg.log; then
  for sg in 0 1; do pf_rows s$sg 8192 "moe_grouped_wgmma_kernel" TERN_MOE_SCALE_GROUPS=$sg; done
fi
tar czf $L/logs.tgz -C $P --exclude='*.ncu-rep' .
stamp done
