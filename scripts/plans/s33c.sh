#!/usr/bin/env bash
# Session 33, the last call (pack .plans/packs/s33c.tar.xz = ff5c7f8: tile config 8-warp-32); carry
# [".plans/packs/s33c.tar.xz"].
#   1. GpuMoeGrouped.* and GpuLibrary.MoeAgainstCpu (8-warp-32 against the CPU, the library, and the default's bits);
#   2. the 1K prefill, TERN_MOE_GROUPED_TILE default / 8-warp-32, two rounds, with the profile's MoE rows
#      (predicted: the up kernel 1 413 -> ~1 050 us a layer, down 735 -> ~560; the 1K prefill 0.166 -> ~0.150 s);
#   3. tern_gpu_bench --only moe_prefill (every tile config at 1K and 8K, one layer).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s33c.tar.xz
source scripts/plans/env.sh
L=$OUT
P=$(mktemp -d)
stamp "1. tests"
timeout 150 $G/tern_gpu_tests --gtest_filter='GpuMoeGrouped*:GpuLibrary.MoeAgainstCpu*' > $L/moe-tests.log 2>&1; rc=$?
echo "rc $rc"; pf $L/moe-tests.log 10; grep -c "^\[       OK" $L/moe-tests.log
if [[ $rc -eq 0 ]]; then
  stamp "2. 1K prefill: default / 8-warp-32"
  for r in 1 2; do
    for v in default 8-warp-32; do
      TERN_MOE_GROUPED_TILE=$v timeout 60 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 \
        --batches 1 --steps 2 --warmup 1 --profile --profile-top 4 > $P/t-$r-$v.log 2>&1; echo "rc $? ($r $v)"
      grep -hE "^prefill \||error" $P/t-$r-$v.log | head -1 | cut -c1-100
      grep -hE "^\| moe_grouped_kernel" $P/t-$r-$v.log | head -2 | cut -c1-130
    done
  done
  stamp "3. moe_prefill bench"
  timeout 120 $G/tern_gpu_bench --only moe_prefill > $L/moe-bench.log 2>&1; echo "rc $? (bench)"
  grep -E "^\| moe_prefill|copy bandwidth" $L/moe-bench.log | head -24 | cut -c1-160
fi
stamp done
