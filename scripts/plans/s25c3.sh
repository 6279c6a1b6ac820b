#!/usr/bin/env bash
# Session 25's third call. s25c2 (H100) found the new mix kernel 4.3 us slower at 16 tokens: its fn staging loop
# strode by blockDim.x, so it did not unroll and kept one DRAM load in flight; now a constant stride again. Pack s25b
# (the HEAD: that fix, hc_pre's finish in the mix at 1-2 tokens, the cluster split where the grid is one block an SM,
# exact rows of 4 a warp from 3 tokens, and issue #17's tests in explicit contexts). Base: s24 (ce72b33).
#   1. bench-step base / new / base / new at 1 / 16 / 64, the new binary's A/B arms (each new switch off);
#   2. own times at batches 1 and 16 (the mix's time back at ~5.7 / ~7.5 us?). (The whole GPU suites ran on the
#      helper's final binaries the same hour: scripts/gpu-check --no-bench --no-sanitizers, all passed.)
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s25b.tar.xz}
source scripts/plans/env.sh
unpack .plans/packs/s24.tar.xz build-base
echo "base commit $(cat build-base/commit.txt)"
L=$OUT/logs; mkdir -p $L
stamp "1. bench-step base / new / base / new at 1 / 16 / 64"
n=0
for b in base cuda base cuda; do
  n=$((n + 1))
  ab=""; [[ $n == 2 ]] && ab="--ab TERN_X8_CLUSTER=0 --ab TERN_HC_FINISH_IN_MIX=0 --ab-rounds 2"
  timeout 150 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 \
    --steps 12 --warmup 3 $ab > $L/bs-$n-$b.log 2>&1; echo "rc $? ($b)"
  grep -hE "^(decode|prefill|ab) |error" $L/bs-$n-$b.log | cut -c1-150 | head -18
done
stamp "2. own times at batches 1 and 16 (PDL and side stream off): the mix back at ~5.7 / ~7.5 us?"
for bt in 1 16; do
  TERN_PDL=0 TERN_SIDE_STREAM=0 timeout 40 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 \
    --batches $bt --steps 10 --warmup 3 --profile --profile-batches $bt --profile-top 40 > $L/profile-b$bt.log 2>&1
  echo "rc $?"; grep -A45 "profile at batch $bt," $L/profile-b$bt.log | grep -E "^\| (category|mhc|dense|total)|linear_exact|hc_" | cut -c1-140
done
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
