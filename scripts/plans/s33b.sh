#!/usr/bin/env bash
# Session 33, the last call (pack .plans/packs/s33b.tar.xz: the L2 hint on by default (256) and the profiler's clone
# map, so a traced replay's records name the captured graph's nodes); carry [".plans/packs/s33b.tar.xz"].
#   1. GpuProfiler.* (TracedReplayNamesTheEdgesNodes: every record's node on an edge of its graph);
#   2. the batch-16 timeline through trace-chain without the offline id rewrite (compare with session 33's
#      hand-mapped path: 23 655 us, moe_bulk up 10 388 + down 5 472, linear_x8<16> 2 637);
#   3. the 1K prefill's grouped experts: mma.sync (default) / wgmma at 32 pairs a tile / e4m3, one round each
#      (session 10 on the H200: wgmma at 32 pairs 2.17 ms a layer against mma.sync's 1.74; not rerun since);
#   4. prefill 1K / 8K at the new defaults, for the record.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s33b.tar.xz
source scripts/plans/env.sh
L=$OUT
P=$(mktemp -d)
stamp "1. GpuProfiler.*"
timeout 120 $G/tern_gpu_tests --gtest_filter='GpuProfiler.*' > $L/profiler-tests.log 2>&1; echo "rc $?"
pf $L/profiler-tests.log 8; grep -c "^\[       OK" $L/profiler-tests.log
stamp "2. batch-16 timeline"
TERN_PROFILE_TRACE=$P/b16.tsv timeout 90 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 \
  --batches 16 --steps 4 --warmup 3 --profile --profile-batches 16 --profile-top 12 > $P/b16.log 2>&1; echo "rc $? (trace)"
python3 scripts/trace-chain $P/b16.tsv --session 2 --top 40 > $L/b16-chain.txt 2>&1; echo "rc $? (chain)"
head -1 $L/b16-chain.txt; tail -41 $L/b16-chain.txt | head -16
stamp "3. 1K grouped experts: mma / wgmma 32 / e4m3"
for v in mma wgmma e4m3; do
  TERN_MOE_GROUPED=$v TERN_MOE_WGMMA_N=$([[ $v == mma ]] && echo auto || echo 32) timeout 100 $T bench-step --device cuda \
    --config full --contexts 1024 --prefill 1024 --batches 1 --steps 2 --warmup 1 --profile --profile-top 6 \
    > $P/g-$v.log 2>&1; echo "rc $? ($v)"
  grep -hE "^prefill \||error" $P/g-$v.log | head -1 | cut -c1-100
  grep -hE "^\| moe_grouped" $P/g-$v.log | head -3 | cut -c1-150
done
stamp "4. prefill 1K / 8K, defaults"
for p in 1024 8192; do
  timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill $p --batches 1 --steps 2 --warmup 1 \
    > $P/pf-$p.log 2>&1; echo "rc $? ($p)"
  grep -hE "^prefill \||error" $P/pf-$p.log | head -1 | cut -c1-100
done
stamp done
