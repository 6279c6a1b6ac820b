#!/usr/bin/env bash
# Session 24's first call. Packs: .plans/packs/base-5d0ac2d.tar.xz (session 23's code) and s24.tar.xz (the HEAD with
# finish_split_k's loads in flight, and linear_x8's cluster split behind TERN_X8_CLUSTER); carry [".plans"].
#   0. the two op tests session 23 mended without a GPU (bd44d0d) and every split-K product's tests (the adder is new);
#   1. the dense products alone, base then new (--only linear): predicted -1 to -1.5 us a split product at 1 token,
#      -3 to -5 us at 16 (wq_a 10.4 -> ~6, wkv 10.4 -> ~6);
#   2. bench-step base / new / base / new at batches 1 / 16 / 64: predicted -2 to -4% at 1, -2 to -3.5% at 16; the new
#      binary's runs carry the A/B of TERN_X8_CLUSTER=1 (the split sums through the cluster's shared memory: predicted
#      a further -1 to -1.5 us a split product, -3 to -5% at batch 1).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s24.tar.xz}
source scripts/plans/env.sh
unpack .plans/packs/base-5d0ac2d.tar.xz build-base
echo "base commit $(cat build-base/commit.txt)"
if [[ ${PART:-a} == a ]]; then
stamp "0. mended op tests; split-K products' tests"
timeout 150 $G/tern_gpu_tests --gtest_filter='GpuActFp8.E4m3EveryFoldShiftAgainstCpu:*GpuBasic.Linear*:*GpuBasic.GroupedLinear*:*GpuBasic.StackedLinear*:*GpuBasic.ExactOnTensorCores*:*GpuActFp8Linear.*:GpuPdl.*:*GpuGraphs*:GpuExactTc.*' \
  > $OUT/ops0.log 2>&1; echo "rc $?"; pf $OUT/ops0.log 20; grep -c "^\[       OK" $OUT/ops0.log
stamp "1. dense products, base then new"
for b in base cuda cluster; do
  d=$b; [[ $b == cluster ]] && d=cuda
  TERN_X8_CLUSTER=$([[ $b == cluster ]] && echo 1 || echo 0) timeout 60 build-$d/tests/gpu/tern_gpu_bench --only linear \
    > $OUT/linear-$b.log 2>&1; echo "rc $? ($b)"
  grep -E "T=(1|16|64) " $OUT/linear-$b.log | sed -E 's/ +/ /g' | cut -c1-150 | head -40
done
stamp "2. bench-step base / new / base / new"
n=0
for b in base cuda base cuda; do
  n=$((n + 1)); (( $(date +%s) - T0 > 470 )) && { echo "skipped: time"; break; }
  ab=""; [[ $n == 2 ]] && ab="--ab TERN_X8_CLUSTER=1 --ab TERN_MOE_STAGE_QUANT=1 --ab TERN_MOE_EARLY_DOWN=1 --ab-rounds 2"
  timeout 150 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 \
    --steps 12 --warmup 3 $ab > $OUT/bs-$b-$RANDOM.log 2>&1; echo "rc $? ($b)"
  grep -hE "^(decode|prefill|ab) |^A/B|\|" $(ls -t $OUT/bs-$b-*.log | head -1) | grep -v "^| batch\|^|---" | cut -c1-170 | head -16
done
fi
stamp done
