#!/usr/bin/env bash
# Session 29, call 1 (pack s28e = b9be84e, carry [".plans"]): session 28's unrun call 4 (s28c4.sh) with longer timeouts,
# then ncu's warp stall sampling on the resident bulk kernels at T = 1 (the one-token steady rate: ~72% of copy against
# the plain ring's 95%). Logs straight to $OUT.
#   1. tests: the layouts test (resident / claims / claimed runs against fixed ranges, bits, at 1-4, 16, 64 tokens),
#      the act-fp8 MoE tests, GpuV4.Moe*, the graph / greedy / batch invariance / mixed / step-table model tests;
#   2. in-process A/B, three rounds at batch 1 and 16: TERN_MOE_RESIDENT=0, TERN_MOE_EARLY_DOWN=1, TERN_MOE_CLAIM_RUNS=1
#      (predicted -2 to -4% at 16 from the up kernel's 15 us tail; nothing at 1);
#   3. the timeline with claimed runs at 16 tokens, and the defaults';
#   4. ncu source counters on the first up and down launches of tern_gpu_bench --only moe --quick (resident at T = 1).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s28e.tar.xz
source scripts/plans/env.sh
L=$OUT
stamp "1. tests"
timeout 120 $G/tern_gpu_tests --gtest_filter='*MoeLayouts*:*GpuActFp8Linear.Moe*:*GpuV4.Moe*' > $L/ops.log 2>&1
echo "rc $?"; pf $L/ops.log 12; grep -c "^\[       OK" $L/ops.log
timeout 110 $G/tern_gpu_model_tests --gtest_filter='*GpuGraphs_.ReplayEqualsEager*:*Greedy*:*BatchInvariance*:*MixedSteps*:*StepTables*' \
  > $L/model.log 2>&1; echo "rc $?"; pf $L/model.log 6; grep -c "^\[       OK" $L/model.log
stamp "2. A/B"
timeout 150 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16 --steps 12 --warmup 3 \
  --ab TERN_MOE_RESIDENT=0 --ab TERN_MOE_EARLY_DOWN=1 --ab TERN_MOE_CLAIM_RUNS=1 --ab-rounds 3 > $L/ab.log 2>&1; echo "rc $?"
grep -hE "^(decode|ab) |error" $L/ab.log | grep -v prefill | cut -c1-160
stamp "3. timelines"
TERN_MOE_CLAIM_RUNS=1 timeout 45 $G/tern_gpu_bench --only moe_timeline > $L/timeline-runs.log 2>&1; echo "rc $?"
grep -E "^\| (up|down)|path" $L/timeline-runs.log
timeout 45 $G/tern_gpu_bench --only moe_timeline > $L/timeline.log 2>&1; echo "rc $?"
grep -E "^\| (up|down)|path" $L/timeline.log
stamp "4. ncu"
timeout 150 ncu --clock-control none --kernel-name regex:moe_bulk --launch-count 2 --section SourceCounters \
  --section WarpStateStats --section SchedulerStats --section SpeedOfLight --import-source yes -o $OUT/bulk \
  $G/tern_gpu_bench --only moe --quick > $OUT/ncu.log 2>&1; echo "rc $?"
tail -3 $OUT/ncu.log
timeout 60 ncu -i $OUT/bulk.ncu-rep --page source --csv --print-source sass > $OUT/src.csv 2>$OUT/src.err; echo "rc $? (source page)"
timeout 60 ncu -i $OUT/bulk.ncu-rep --page details > $OUT/details.txt 2>&1
grep -E "moe_bulk|Duration|DRAM Through|Active Warps|Eligible" $OUT/details.txt | head -20
gzip $OUT/src.csv
stamp done
