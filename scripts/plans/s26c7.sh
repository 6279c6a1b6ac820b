#!/usr/bin/env bash
# Session 26, call 7 (the last): the op tests call 6 did not reach in its 250 s (from GpuV4.MoeExperts/v4flash on),
# and the session's code against the base once more (bench-step, two rounds each) with the path's profile (side
# stream on, the real configuration) at batch 1 and 16 for the record. Pack s26f (5196df3), base s26 (650fe6a).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s26f.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s26.tar.xz build-base
L=$OUT/logs; mkdir -p $L
stamp "1. the rest of the op tests"
timeout 200 $G/tern_gpu_tests --gtest_filter='Shapes/GpuV4.MoeExperts/v4flash:Shapes/GpuV4.MoeSharedAddedInTheCombine/fixture:Shapes/GpuV4.MoeSharedAddedInTheCombine/v4flash:Shapes/GpuV4.MoeExpertsExact/fixture:Shapes/GpuV4.MoeExpertsExact/v4flash:Shapes/GpuV4.MoeVariantsBitIdentical/fixture:Shapes/GpuV4.MoeVariantsBitIdentical/v4flash:Shapes/GpuV4.MoeExpertTableFollowsItsExperts/fixture:Shapes/GpuV4.MoeExpertTableFollowsItsExperts/v4flash:Shapes/GpuIndexerMma.ScoresAgainstCpu/fixture:Shapes/GpuIndexerMma.ScoresAgainstCpu/v4flash:Shapes/GpuIndexerMma.ScoresDoNotDependOnTheChunk/fixture:Shapes/GpuIndexerMma.ScoresDoNotDependOnTheChunk/v4flash:Shapes/GpuIndexerMma.TopkMatchesF32Paths/fixture:Shapes/GpuIndexerMma.TopkMatchesF32Paths/v4flash:Shapes/GpuAttentionPrefill.MatchesCpuAndDecodeKernel/fixture:Shapes/GpuAttentionPrefill.MatchesCpuAndDecodeKernel/v4flash:Shapes/GpuAttentionPrefill.OpTakesPrefillKernelOnlyForLibraryChunks/fixture:Shapes/GpuAttentionPrefill.OpTakesPrefillKernelOnlyForLibraryChunks/v4flash' > $L/ops-rest.log 2>&1; echo "rc $?"; pf $L/ops-rest.log 12; grep -c "^\[       OK" $L/ops-rest.log
stamp "2. bench-step base / new, two rounds"
for r in 1 2; do
  for b in base cuda; do
    timeout 100 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 \
      --steps 12 --warmup 3 > $L/bs-$r-$b.log 2>&1; echo "rc $? ($r $b)"
    grep -hE "^(decode|prefill) |error" $L/bs-$r-$b.log | cut -c1-110
  done
done
stamp "3. the path with the side stream on (new)"
(( $(date +%s) - T0 < 420 )) && { timeout 70 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16 \
  --steps 10 --warmup 3 --profile --profile-batches 1,16 --profile-top 30 > $L/path.log 2>&1; echo "rc $?"
  for bt in 1 16; do grep -A14 "profile at batch $bt," $L/path.log | grep -E "^\| (attention|indexer|compressor|moe|dense|mhc|total) |GPU busy" | cut -c1-120; done; }
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
