#!/usr/bin/env bash
# Session 26, call 9: the decode step's timeline (TERN_PROFILE_TRACE) at batch 1 and 16 with the side stream on, on
# the session's code (pack s26h), for analysis off the GPU: does the attention's join wait for the compressor /
# indexer branch in CSA layers, and how long is each branch? Also the trace with the side stream off (the path).
# Carry [".plans"].
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s26h.tar.xz
source scripts/plans/env.sh
L=$OUT/logs; mkdir -p $L
stamp "1. GpuProfiler tests"
timeout 60 $G/tern_gpu_tests --gtest_filter='*GpuProfiler*' > $L/ops.log 2>&1; echo "rc $?"; pf $L/ops.log 4
stamp "2. traces"
for side in 1 0; do
  TERN_SIDE_STREAM=$side TERN_PROFILE_TRACE=$OUT/trace-side$side.tsv timeout 90 $T bench-step --device cuda --config full \
    --contexts 1024 --prefill 1024 --batches 1,16 --steps 4 --warmup 3 --profile --profile-batches 1,16 --profile-top 10 \
    > $L/trace-side$side.log 2>&1; echo "rc $? (side $side)"; grep -hE "^decode " $L/trace-side$side.log | cut -c1-110
  ls -la $OUT/trace-side$side.tsv; grep -c "^# session" $OUT/trace-side$side.tsv
done
gzip $OUT/trace-side*.tsv
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
