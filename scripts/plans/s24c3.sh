#!/usr/bin/env bash
# Session 24's last try with ~300 s of budget left: the essentials of s24c2.sh only (the cluster split's test, the A/B
# of TERN_X8_CLUSTER in one process, base against new once, the split products' tests). carry [".plans"].
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s24.tar.xz}
source scripts/plans/env.sh
unpack .plans/packs/base-5d0ac2d.tar.xz build-base
stamp "0. the cluster split's bits against the workspace's"
timeout 60 $G/tern_gpu_tests --gtest_filter='*GpuActFp8Linear.ClusterSplit*' > $OUT/ops-cluster.log 2>&1; crc=$?
echo "rc $crc"; pf $OUT/ops-cluster.log 8
carm="--ab TERN_X8_CLUSTER=1"; [[ $crc == 0 ]] || carm=""
stamp "1. bench-step new (A/B) then base"
for b in cuda base; do
  ab=""; [[ $b == cuda ]] && ab="$carm --ab TERN_X8_QUANT_MAX_N=16 --ab-rounds 2"
  timeout 100 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 \
    --steps 12 --warmup 3 $ab > $OUT/bs-$b.log 2>&1; echo "rc $? ($b)"
  grep -hE "^(decode|prefill|ab) |error" $OUT/bs-$b.log | cut -c1-150 | head -14
done
stamp "2. split-K products' tests"
timeout 100 $G/tern_gpu_tests --gtest_filter='*GpuBasic.Linear*:*GpuBasic.GroupedLinear*:*GpuActFp8Linear.*:GpuPdl.*:*GpuV4.Mhc*' \
  > $OUT/ops0.log 2>&1; echo "rc $?"; pf $OUT/ops0.log 20; grep -c "^\[       OK" $OUT/ops0.log
stamp done
