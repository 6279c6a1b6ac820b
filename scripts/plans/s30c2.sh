#!/usr/bin/env bash
# Session 30, call 2 (pack s30b: call 1's code with the q-norm fold reverted and TERN_BRANCH_PRIORITY rebuilt as one
# switch: the CSA indexer's branch at the greatest stream priority, the main lane and every other branch at the least,
# as all were before; carry [".plans", ".whl"]). Logs straight to $OUT.
#   1. tests: the graphs against eager (the switch on among them), the MoE routing in the plan kernel;
#   2. in-process at batch 1, 16, 64, three rounds: TERN_BRANCH_PRIORITY=1 (predicted: batch 16 -1% as in call 1,
#      batch 1 at nothing to -0.5% now that the shared expert keeps the main lane's priority, 64 unchanged);
#   3. ncu on the 1K prefill's grouped MoE kernels on mma.sync (moe_grouped_kernel, up and down of the 1K context
#      prefill's second layer): every expert is read at 1K tokens and they stream at ~58% of copy (session 29);
#   4. issue #17's closing server check: scripts/gpu-check --model-only --server --no-bench --no-sanitizers (the
#      runner-built eager tables through `tern serve --device cuda`, host and device sampling, and the PD tests).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s30b.tar.xz
source scripts/plans/env.sh
L=$OUT
stamp "1. tests"
timeout 150 $G/tern_gpu_model_tests --gtest_filter='*GpuGraphs_.ReplayEqualsEager*' > $L/model.log 2>&1
echo "rc $?"; pf $L/model.log 6; grep -c "^\[       OK" $L/model.log
timeout 100 $G/tern_gpu_tests --gtest_filter='*MoeRoutingInThePlanKernel*' > $L/ops.log 2>&1
echo "rc $?"; pf $L/ops.log 6; grep -c "^\[       OK" $L/ops.log
stamp "2. priorities in-process"
timeout 200 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 --steps 12 --warmup 3 \
  --ab TERN_BRANCH_PRIORITY=1 --ab-rounds 3 > $L/ab.log 2>&1; echo "rc $?"
grep -hE "^(decode|ab) |error" $L/ab.log | grep -v prefill | cut -c1-170
stamp "3. ncu moe_grouped_kernel at 1K"
timeout 150 ncu --clock-control none --kernel-name regex:"moe_grouped_kernel" --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
  --section MemoryWorkloadAnalysis -o $OUT/moe1k \
  $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 1024 --steps 1 --warmup 0 \
  > $OUT/ncu.log 2>&1; echo "rc $?"
tail -2 $OUT/ncu.log
timeout 60 ncu -i $OUT/moe1k.ncu-rep --page details > $OUT/ncu-details.txt 2>&1
grep -E "moe_grouped|Duration|DRAM Through|Compute \(SM\) Through|Registers Per|Achieved Occ|Eligible Warps|No Eligible|Issued Warp|Block Limit (Reg|Shared)|Stall" \
  $OUT/ncu-details.txt | head -40
stamp "4. gpu-check --server"
timeout 330 scripts/gpu-check --model-only --server --no-bench --no-sanitizers build-cuda > $L/gpu-check.log 2>&1
echo "rc $?"; grep -A30 "gpu-check summary" $L/gpu-check.log | head -30
stamp done
