#!/usr/bin/env bash
# Session 32, call 1 (prefill; pack s32b = the L2 prefetch hint on the grouped MoE's weight copies, on d03d937's code):
# carry [".plans"]. One binary, A/B by environment.
#   (the steps run 1, 2, 3, 0, 4: the measurements first, should the call be cut)
#   0. tests: GpuLibrary.MoeAgainstCpu (the hint's bits equal to none, both FP4 formats; GpuMoeGrouped's V4-Flash
#      CPU references take ~190 s, left to the closing gpu-check), the prefill attention (the q-norm fold's bits; the FP8 epilogue), the model tests;
#   1. the tile read probe (tern_gpu_bench --only tile_probe): 256 rows x 64 bytes a stage, with no hint and with
#      the 128 / 256-byte L2 prefetch hints, against longer runs a row at the same 16 KB stage. Predicted: 64-byte
#      runs ~60% of copy, 512 / 2 048 ~90%; the 256-byte hint within a few % of the 256-byte runs;
#   2. TERN_MOE_L2_HINT 0 / 128 / 256 at prefill 1K (the mma.sync kernel, 32-pair tiles) and 8K (the wgmma kernel),
#      two rounds. Predicted, if the probe confirms: 1K -10 to -18% (the routed experts ~85 of 176 ms GPU at ~58% of
#      copy on the H100), 8K -3 to -8% (MoE wgmma 241 of 803 ms, less memory-bound at 192 pairs an expert);
#   3. TERN_Q_NORM_FOLD=0 against the default (on), prefill 1K and 8K, two rounds (predicted 8K -10 to -20 ms on the
#      H100 for the fold; if it loses, the default goes off);
#   4. the 1K prefill's profile with the better hint (the routed experts' kernels by name).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s32b.tar.xz
source scripts/plans/env.sh
L=$OUT
P=$(mktemp -d)
stamp "1. tile read probe"
timeout 120 $G/tern_gpu_bench --only tile_probe > $L/tile-probe.log 2>&1; echo "rc $?"
grep -E "^\||copy bandwidth" $L/tile-probe.log | head -40
stamp "2. TERN_MOE_L2_HINT 0 / 128 / 256"
envab TERN_MOE_L2_HINT "0 128 256" 2 1024 8192
stamp "3. TERN_Q_NORM_FOLD 0 / 1"
envab TERN_Q_NORM_FOLD "0 1" 2 1024 8192
stamp "0. tests"
timeout 150 $G/tern_gpu_tests --gtest_filter='*GpuLibrary.MoeAgainstCpu*:*GpuAttentionPrefill*:*GroupedFromFp8Rows*' \
  > $P/ops.log 2>&1
echo "rc $?"; pf $P/ops.log 10; grep -c "^\[       OK" $P/ops.log
timeout 150 $G/tern_gpu_model_tests --gtest_filter='*GpuModel_.*:*GpuGraphs_.ReplayEqualsEager*:-*Speed*' \
  > $P/model.log 2>&1; echo "rc $?"; pf $P/model.log 8; grep -c "^\[       OK" $P/model.log
stamp "4. 1K prefill profile, hint 256 and 0"
for v in 256 0; do
  TERN_MOE_L2_HINT=$v timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1 \
    --steps 2 --warmup 1 --profile --profile-top 14 > $L/pf1k-hint$v.log 2>&1; echo "rc $? (hint $v)"
  grep -E "moe_grouped|prefill \||GPU busy" $L/pf1k-hint$v.log | head -8 | cut -c1-160
done
stamp done
