#!/usr/bin/env bash
# Session 29, call 2 (pack s29a: claimed runs removed (+14% at batch 16 in call 1), TERN_MOE_EARLY_DOWN on where the down
# kernel is resident; tern_gpu_bench --only act_quant; carry [".plans"]). Logs straight to $OUT.
#   1. tests: the layouts test (resident / claims / early down against fixed ranges, bits), GpuActFp8Linear.Moe*,
#      GpuV4.Moe*, the graph / greedy / batch invariance / step-table model tests;
#   2. in-process A/B, three rounds at batch 1, 16, 64: TERN_MOE_EARLY_DOWN=0 (predicted +0.4 to +1% at 1, nothing at
#      16 / 64: the kernel ignores it there);
#   3. act_quant alone at decode and prefill sizes (the 8K prefill's profile credits it 143 us a call beside other
#      streams' kernels), and ncu on 8 192 x 4 096;
#   4. the dense products alone (--only linear, T = 1, 16, 64; op vs the library at 64: 33 against 19 us in session 22)
#      and ncu (speed of light, warp states, source counters) on linear_x8 of wq_b (32768 x 1024) at 1, 16, 64 tokens;
#   5. the 8K prefill's profile.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s29a.tar.xz
source scripts/plans/env.sh
L=$OUT
stamp "1. tests"
timeout 100 $G/tern_gpu_tests --gtest_filter='*MoeLayouts*:*GpuActFp8Linear.Moe*:*GpuV4.Moe*' > $L/ops.log 2>&1
echo "rc $?"; pf $L/ops.log 12; grep -c "^\[       OK" $L/ops.log
timeout 80 $G/tern_gpu_model_tests --gtest_filter='*GpuGraphs_.ReplayEqualsEager*:*Greedy*:*BatchInvariance*:*StepTables*' \
  > $L/model.log 2>&1; echo "rc $?"; pf $L/model.log 6; grep -c "^\[       OK" $L/model.log
stamp "2. A/B"
timeout 130 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 --steps 12 --warmup 3 \
  --ab TERN_MOE_EARLY_DOWN=0 --ab-rounds 3 > $L/ab.log 2>&1; echo "rc $?"
grep -hE "^(decode|ab) |error" $L/ab.log | grep -v prefill | cut -c1-160
stamp "3. act_quant"
timeout 40 $G/tern_gpu_bench --only act_quant > $L/act.log 2>&1; echo "rc $?"; grep -E "act_quant|copy" $L/act.log
timeout 60 ncu --clock-control none --kernel-name regex:act_quant --launch-skip 8 --launch-count 4 --section SpeedOfLight \
  --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  $G/tern_gpu_bench --profile --only act_quant > $L/act-ncu.log 2>&1; echo "rc $?"
grep -E "act_quant_kernel|Duration|DRAM Through|Achieved Occ|Eligible Warps|Warp Cycles Per Issued|L2 Hit|Mem Busy" $L/act-ncu.log | head -40
stamp "4. dense products"
timeout 100 $G/tern_gpu_bench --only linear --quick > $L/linear.log 2>&1; echo "rc $?"
grep -E "act-fp8 x8|copy bandwidth" $L/linear.log | cut -c1-140
timeout 120 ncu --clock-control none --kernel-name regex:linear_x8 --launch-count 12 --section SpeedOfLight \
  --section WarpStateStats --section SchedulerStats --section Occupancy --section SourceCounters --import-source yes \
  -o $OUT/x8 $G/tern_gpu_bench --profile > $L/x8-ncu.log 2>&1; echo "rc $?"
timeout 60 ncu -i $OUT/x8.ncu-rep --page details > $L/x8-details.txt 2>&1
grep -E "linear_x8_kernel|Duration|DRAM Through|Eligible Warps|Active Warps|Registers Per" $L/x8-details.txt | head -60
timeout 60 ncu -i $OUT/x8.ncu-rep --page source --csv --print-source sass > $OUT/x8-src.csv 2>/dev/null; gzip $OUT/x8-src.csv
stamp "5. 8K prefill profile"
timeout 100 $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 8192 --profile \
  --profile-batches 1 --profile-top 30 --steps 3 --warmup 1 > $L/prefill-profile.log 2>&1; echo "rc $?"
grep -E "^prefill" $L/prefill-profile.log | head -5
stamp done
