#!/usr/bin/env bash
# Session 35, call 2 (pack .plans/packs/s35a.tar.xz = the commit after 6257798 with the TEMPORARY
# TERN_COMPRESS_PACK_RUNS knob; carry [".plans/packs/s35a.tar.xz"]):
#   1. `*GpuAttentionPrefill*` (version 5 after the steps' removal: a block a query, the tables step kept) and the GPU
#      model tests (the compressor's rows packed and stored in two launches a sequence);
#   2. the 8K prefill, two rounds of: the page-run packs (TERN_COMPRESS_PACK_RUNS=1, the old path), the new default,
#      the new default with version 5's q prefetch (TERN_ATTENTION_WS_PREFETCH=1); the 1K once each;
#   3. the 8K prefill on the e4m3 grouped MoE kernels, and the moe_prefill kernel bench (bf16 wgmma / e4m3 at 8K);
#   4. ncu of version 5 on the bench's CSA layer (its first launch of the <512, true> instance: mangled name).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s35a.tar.xz
source scripts/plans/env.sh
L=$OUT
P=$(mktemp -d)
stamp "1. tests"
timeout 200 $G/tern_gpu_tests --gtest_filter='*GpuAttentionPrefill*' > $P/ap.log 2>&1; echo "rc $?"
pf $P/ap.log 6; grep -c "^\[       OK" $P/ap.log
timeout 300 $G/tern_gpu_model_tests > $P/model.log 2>&1; echo "rc $? (model)"
pf $P/model.log 6; grep -c "^\[       OK" $P/model.log
stamp "2. prefill: runs / new / new + q prefetch"
run_pf() {  # NAME PREFILL ENV...
  local name=$1 p=$2; shift 2
  env "$@" timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill $p --batches 1 --steps 2 \
    --warmup 1 --profile --profile-top 80 > $P/pf-$p-$name.log 2>&1; echo "rc $? ($p $name)"
  grep -hE "^prefill \||error" $P/pf-$p-$name.log | head -1 | cut -c1-100
  grep -hE "^\| (attention_prefill_ws|kv_pack_kernel|store_rows_kernel|attention_kv_bf16)" $P/pf-$p-$name.log | cut -c1-140
}
for r in 1 2; do
  run_pf runs-$r 8192 TERN_COMPRESS_PACK_RUNS=1
  run_pf new-$r 8192 TERN_COMPRESS_PACK_RUNS=0
  run_pf pf1-$r 8192 TERN_ATTENTION_WS_PREFETCH=1
done
cp $P/pf-8192-new-1.log $L/
run_pf runs 1024 TERN_COMPRESS_PACK_RUNS=1
run_pf new 1024 TERN_COMPRESS_PACK_RUNS=0
run_pf pf1 1024 TERN_ATTENTION_WS_PREFETCH=1
stamp "3. e4m3 grouped MoE at 8K"
run_pf e4m3 8192 TERN_MOE_GROUPED=e4m3
grep -hE "^\| moe_grouped" $P/pf-8192-e4m3.log $P/pf-8192-new-1.log | cut -c1-140
run_pf e4m3 1024 TERN_MOE_GROUPED=e4m3
grep -hE "^\| moe_grouped" $P/pf-1024-e4m3.log $P/pf-1024-new.log | cut -c1-140
for n in 96 128; do
  run_pf n$n 8192 TERN_MOE_WGMMA_N=$n
  grep -hE "^\| moe_grouped" $P/pf-8192-n$n.log | cut -c1-140
done
timeout 120 $G/tern_gpu_bench --only moe_prefill > $L/moe-prefill.log 2>&1; echo "rc $? (moe_prefill bench)"
grep -E "8192|e4m3|wgmma" $L/moe-prefill.log | head -20 | cut -c1-160
stamp "4. ncu of version 5 on the bench's CSA layer"
timeout 240 ncu --clock-control none --kernel-name-base mangled --kernel-name regex:"attention_prefill_ws_kernelILi512ELb1E" \
  --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
  --section Occupancy --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SourceCounters \
  --import-source no -o $P/csa $G/tern_gpu_bench --only attention_prefill > $L/ncu-csa.log 2>&1; echo "rc $?"
timeout 60 ncu -i $P/csa.ncu-rep --page source --csv --print-source sass > $L/sass-csa.csv 2>/dev/null
timeout 60 ncu -i $P/csa.ncu-rep --page details > $L/details-csa.txt 2>&1
grep -E "attention_prefill_ws|Duration|Grid Size|Issued Warp|Eligible Warps|No Eligible|Shared|Tensor" $L/details-csa.txt | head -16 | cut -c1-150
stamp done
