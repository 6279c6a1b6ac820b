#!/usr/bin/env bash
# Written in session 32, whose every start failed: the first call of the next session (pack s32d = a gpu-pack of
# HEAD at or after 8df0ac1: the L2 hint on the grouped MoE's weight copies + the warp-specialised prefill attention
# kernel, version 4; rebuild it with `scripts/gpu-pack build-cuda` if .plans is gone); carry [".plans/packs/s32d.tar.xz"]. One binary, A/B by environment; the measurements most worth having first.
#   1. the tile read probe: 256 rows x 64 bytes a stage with no hint / the 128 / 256-byte L2 prefetch hints, against
#      longer runs a row at the same 16 KB stage (predicted: 64-byte runs ~60% of copy, 512+ ~90%, the 256 hint near
#      the 256-byte runs);
#   2. TERN_MOE_L2_HINT 0 / 256 at prefill 1K (mma.sync grouped kernel) and 8K (wgmma), one round (predicted, if
#      the probe confirms: 1K -10 to -18%, 8K -3 to -8%);
#   3. version 4's tests (GpuAttentionPrefill: against the CPU and version 2, the op's choice, the FP8 epilogue, the
#      q-norm fold), then, if they pass, TERN_ATTENTION_PREFILL 3 / 4 at prefill 1K and 8K, one round (predicted:
#      the attention kernel 3.6 -> ~1.5-2 ms a layer at 8K: 8K -8 to -12%, 1K -3 to -6%), and the kernel bench
#      (tern_gpu_bench --only attention_prefill: versions 0-4, one layer at 8 192 queries);
#   4. TERN_Q_NORM_FOLD 0 / 1 at prefill 8K, one round (predicted -10 to -20 ms for the fold on the H100);
#   5. GpuLibrary.MoeAgainstCpu (the hint's bits equal to none).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s32d.tar.xz
source scripts/plans/env.sh
L=$OUT
P=$(mktemp -d)
stamp "1. tile read probe"
timeout 100 $G/tern_gpu_bench --only tile_probe > $L/tile-probe.log 2>&1; echo "rc $?"
grep -E "^\||copy bandwidth" $L/tile-probe.log | head -34
stamp "2. TERN_MOE_L2_HINT 0 / 256"
envab TERN_MOE_L2_HINT "0 256" 1 1024 8192
stamp "3. version 4: tests"
timeout 150 $G/tern_gpu_tests --gtest_filter='*GpuAttentionPrefill*' > $L/ws-tests.log 2>&1; rc=$?
echo "rc $rc"; pf $L/ws-tests.log 10; grep -c "^\[       OK" $L/ws-tests.log
if [[ $rc -eq 0 ]]; then
  stamp "3b. TERN_ATTENTION_PREFILL 3 / 4"
  envab TERN_ATTENTION_PREFILL "3 4" 1 1024 8192
  timeout 100 $G/tern_gpu_bench --only attention_prefill > $L/attn-bench.log 2>&1; echo "rc $? (bench)"
  grep -E "^\| (csa|hca)|ceiling" $L/attn-bench.log | head -24
fi
stamp "4. TERN_Q_NORM_FOLD 0 / 1 at 8K"
envab TERN_Q_NORM_FOLD "0 1" 1 8192
stamp "5. the hint's bits"
timeout 120 $G/tern_gpu_tests --gtest_filter='*GpuLibrary.MoeAgainstCpu*' > $P/lib.log 2>&1
echo "rc $?"; pf $P/lib.log 6; grep -c "^\[       OK" $P/lib.log
stamp done
