#!/usr/bin/env bash
# Session 30, call 1 (packs s29c = 34ba730, the base, and s30a = this session's code: the prefill chunk's q normed
# and rotated in the prefill attention kernels' q load (AttentionArgs::q_inv_freq; norm_rope's pass over q, 2 GiB a
# layer at 8K, gone from the chunk path); the knobs TERN_MOE_PREP_MAX_TOKENS (moe_prep's token bound, 8) and
# TERN_BRANCH_PRIORITY (stream priorities kept in the graphs' nodes: 1 the CSA indexer's branch first, 2 the main
# lane first); carry [".plans"]). Logs straight to $OUT.
#   1. tests on s30a: the prefill attention (the new fold against norm_rope then the op, bits, and the CPU), the MoE
#      routing in the plan kernel (the bound at 64), the model tests (graphs under both priorities, greedy, batch
#      invariance, the speculative rounds);
#   2. prefill base / new, two rounds at 1K and 8K (predicted: 8K -25 to -30 ms of 822, norm_rope's 31 ms less the
#      kernel's longer q load; 1K -2 to -4 ms of 164);
#   3. in-process on s30a at batch 1, 16, 64: TERN_MOE_PREP_MAX_TOKENS=16 (predicted batch 16 -0.5 to -1%, 1 and 64
#      unchanged), =64 (64: unknown, one block routing 64 tokens serially), TERN_BRANCH_PRIORITY=1 (predicted -0.3 to
#      -1% at 1 and 16: the indexer's join wait is 5-7.5 us a CSA layer), =2;
#   4. the 8K prefill's profile on s30a (attention_prefill_wgmma a layer against session 29's, norm_rope's calls);
#   5. ncu (speed of light, occupancy, warp states, scheduler) on layer 2's (a CSA layer's) prefill attention and
#      grouped wgmma MoE up / down kernels at 8K: what bounds the two largest prefill kernels now.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s30a.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s29c.tar.xz build-base
L=$OUT
stamp "1. tests"
timeout 150 $G/tern_gpu_tests --gtest_filter='*GpuAttentionPrefill*:*MoeRoutingInThePlanKernel*' > $L/ops.log 2>&1
echo "rc $?"; pf $L/ops.log 12; grep -c "^\[       OK" $L/ops.log
timeout 150 $G/tern_gpu_model_tests --gtest_filter='*GpuModel_.*:*GpuGraphs_.*:*GpuSpeculative.*:-*Speed*' \
  > $L/model.log 2>&1; echo "rc $?"; pf $L/model.log 8; grep -c "^\[       OK" $L/model.log
stamp "2. prefill base / new"
for r in 1 2; do
  for b in base cuda; do
    for p in 1024 8192; do
      timeout 100 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill $p --batches 1 \
        --steps 2 --warmup 1 > $L/pf-$p-$r-$b.log 2>&1; echo "rc $? ($p $r $b)"
      grep -hE "^prefill |error" $L/pf-$p-$r-$b.log | cut -c1-140
    done
  done
done
stamp "3. knobs in-process"
timeout 330 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 --steps 12 --warmup 3 \
  --ab TERN_MOE_PREP_MAX_TOKENS=16 --ab TERN_MOE_PREP_MAX_TOKENS=64 --ab TERN_BRANCH_PRIORITY=1 \
  --ab TERN_BRANCH_PRIORITY=2 --ab-rounds 2 > $L/ab.log 2>&1; echo "rc $?"
grep -hE "^(decode|ab) |error" $L/ab.log | grep -v prefill | cut -c1-170
stamp "4. 8K prefill profile"
timeout 120 $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 8192 --profile \
  --profile-top 30 > $L/pf8k-profile.log 2>&1; echo "rc $?"
grep -E "^prefill |attention_prefill|norm_rope|act_quant" $L/pf8k-profile.log | head -12 | cut -c1-170
stamp "5. ncu at 8K"
timeout 200 ncu --clock-control none --kernel-name regex:"moe_grouped_wgmma|attention_prefill_wgmma" --launch-skip 6 \
  --launch-count 3 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis -o $OUT/pf8k \
  $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 8192 --steps 1 --warmup 0 \
  > $OUT/ncu.log 2>&1; echo "rc $?"
tail -2 $OUT/ncu.log
timeout 60 ncu -i $OUT/pf8k.ncu-rep --page details > $OUT/ncu-details.txt 2>&1
grep -E "moe_grouped|attention_prefill|Duration|DRAM Through|Compute \(SM\) Through|Registers Per|Achieved Occ|Eligible Warps|No Eligible|Issued Warp" \
  $OUT/ncu-details.txt | head -40
stamp done
