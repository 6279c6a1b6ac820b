#!/usr/bin/env bash
# Session 28, call 3 (packs s28c: call 2's code + the resident walk's end by a stage count (call 2's end marks
# deadlocked the fixture's down kernel: 12 groups, 5 stages) + TERN_MOE_EARLY_DOWN allowed on the resident down kernel;
# h17: helper-44's branch s28-runner-tables 1957d1e (the step tables one type, the decode graphs in src/engine);
# carry [".plans"]). Logs straight to $OUT (the call may end on the device budget).
#   1. tests on s28c: the resident test, the act-fp8 MoE tests, GpuV4.Moe*, then the model tests that hung in call 2;
#   2. in-process A/B on s28c at batch 1 and 4, three rounds: TERN_MOE_RESIDENT=0, TERN_MOE_CLAIMS=0,
#      TERN_MOE_EARLY_DOWN=1 (predicted: early down -1 to -2% at batch 1 with resident windows);
#   3. helper-44's GPU model tests on h17 (graphs equal to eager, verify and MTP graphs, step tables, batch invariance).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s28c.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/h17.tar.xz build-h17
L=$OUT; 
stamp "1. tests"
timeout 100 $G/tern_gpu_tests --gtest_filter='*MoeResident*:*GpuActFp8Linear.Moe*:*GpuV4.Moe*' > $L/ops.log 2>&1
echo "rc $?"; pf $L/ops.log 12; grep -c "^\[       OK" $L/ops.log
timeout 110 $G/tern_gpu_model_tests --gtest_filter='*GpuGraphs_.ReplayEqualsEager*:*Greedy*:*BatchInvariance*:*MixedSteps*:*StepTables*' \
  > $L/model.log 2>&1; echo "rc $?"; pf $L/model.log 6; grep -c "^\[       OK" $L/model.log
stamp "2. A/B"
timeout 70 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,4 --steps 12 --warmup 3 \
  --ab TERN_MOE_RESIDENT=0 --ab TERN_MOE_CLAIMS=0 --ab TERN_MOE_EARLY_DOWN=1 --ab-rounds 3 > $L/ab.log 2>&1; echo "rc $?"
grep -hE "^(decode|ab) |error" $L/ab.log | grep -v prefill | cut -c1-160
stamp "3. helper-44's model tests (h17)"
timeout 150 build-h17/tests/gpu/tern_gpu_model_tests \
  --gtest_filter='*GpuGraphs_*:*GpuModel_*:GpuModelExact*:*GpuSpeculative*' > $L/h17.log 2>&1; echo "rc $?"
pf $L/h17.log 10; grep -c "^\[       OK" $L/h17.log
stamp done
