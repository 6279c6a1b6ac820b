#!/usr/bin/env bash
# Written in session 26 for the next session's first call (build and pack HEAD first: scripts/gpu-pack build-cuda &&
# cp build-cuda/gpu-pack.tar.xz .plans/packs/s27.tar.xz; carry [".plans"]). The CSA layers' side branch (indexer) is
# still ~9 us a layer longer than the main lane at batch 1 (results.md session 26, call 10): its kernels alone, then the
# timeline again.
#   1. every model test and the profiler / mHC op tests on HEAD;
#   2. the side branch's kernels alone: tern_gpu_bench --only exact (the indexer's wq_b on exact_tc, weights_proj, its
#      compressor's 512-row product), --only indexer (scores, top-k at decode), --only mhc;
#   3. bench-step at 1 / 16 / 64 and the batch-1 / 16 timeline (TERN_PROFILE_TRACE, side stream on) for analysis here:
#      per CSA layer, main lane's last kernel before the join vs the branch's last (indexer_topk), and each kernel's span.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s27.tar.xz}
source scripts/plans/env.sh
L=$OUT/logs; mkdir -p $L
stamp "1. tests"
timeout 200 $G/tern_gpu_model_tests > $L/model.log 2>&1; echo "rc $?"; pf $L/model.log 8; grep -c "^\[       OK" $L/model.log
timeout 60 $G/tern_gpu_tests --gtest_filter='*GpuProfiler*:*GpuV4.Mhc*:*GpuPdl*' > $L/ops.log 2>&1; echo "rc $?"; pf $L/ops.log 6
stamp "2. the side branch's kernels alone"
for only in exact indexer mhc; do
  timeout 90 $G/tern_gpu_bench --only $only > $L/bench-$only.log 2>&1; echo "rc $? ($only)"
  grep -E "^\|" $L/bench-$only.log | sed -E 's/ +/ /g' | cut -c1-140 | head -30
done
stamp "3. bench-step and the timeline"
timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 --steps 12 --warmup 3 \
  > $L/bs.log 2>&1; echo "rc $?"; grep -hE "^(decode|prefill) |error" $L/bs.log | cut -c1-110
TERN_PROFILE_TRACE=$OUT/trace.tsv timeout 90 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 \
  --batches 1,16 --steps 4 --warmup 3 --profile --profile-batches 1,16 --profile-top 10 > $L/trace.log 2>&1; echo "rc $?"
gzip $OUT/trace.tsv
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
