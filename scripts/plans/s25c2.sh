#!/usr/bin/env bash
# Session 25's second call. s24c2 (H100) measured the cluster split per product: wq_a / wkv / w1 / idx.wq_b faster
# (wq_a at 64 tokens 17.8 -> 10.2 us), wo_a / wo_b slower (wo_b at one token 14.9 -> 18.5: 256 blocks in clusters
# of 8); 12230c1 takes it only where the split grid is one block an SM, on by default. New in this pack (s25):
#   - hc_pre's finish inside the mix kernel at 1-2 tokens (TERN_HC_FINISH_IN_MIX, on): 86 launches a step less,
#     predicted -1.5 to -2.5% at batch 1, nothing at 16 / 64;
#   - linear_exact_rows_kernel<4> (the router gate, idx weights_proj) from 3 tokens: a chunk's x loaded once for 4
#     rows, predicted 8.8 -> ~4 us a call at 16 tokens (-1.5% at batch 16), the same bits (GpuExactTc).
# Packs: s24 (ce72b33: the base) and s25 (the HEAD); carry [".plans"].
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s25.tar.xz}
source scripts/plans/env.sh
unpack .plans/packs/s24.tar.xz build-base
echo "base commit $(cat build-base/commit.txt)"
L=$OUT/logs; mkdir -p $L
stamp "0. the new paths' tests (bits against the old paths), then the ops they touch"
timeout 120 $G/tern_gpu_tests --gtest_filter='*GpuMhc*:*GpuV4.Mhc*:*GpuBasic.Linear*:*GpuActFp8Linear.ClusterSplit*:GpuPdl.*' \
  > $L/ops-new.log 2>&1; echo "rc $?"; pf $L/ops-new.log 16; grep -c "^\[       OK" $L/ops-new.log
stamp "1. bench-step base / new / base / new at 1 / 16 / 64 (the new binary's A/B arms: each switch off)"
n=0
for b in base cuda base cuda; do
  n=$((n + 1)); (( $(date +%s) - T0 > 400 )) && { echo "skipped: time"; break; }
  ab=""; [[ $n == 2 ]] && ab="--ab TERN_X8_CLUSTER=0 --ab TERN_HC_FINISH_IN_MIX=0 --ab-rounds 2"
  timeout 150 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 \
    --steps 12 --warmup 3 $ab > $L/bs-$n-$b.log 2>&1; echo "rc $? ($b)"
  grep -hE "^(decode|prefill|ab) |error" $L/bs-$n-$b.log | cut -c1-150 | head -18
done
stamp "2. model tests on the new defaults (batch invariance, step tables, mixed steps, greedy decode: graphs included)"
(( $(date +%s) - T0 < 460 )) && { timeout 100 $G/tern_gpu_model_tests \
  --gtest_filter='*BatchInvariance*:*StepTables*:*MixedSteps*:*GreedyDecode*' > $L/model-tests.log 2>&1; echo "rc $?";
  pf $L/model-tests.log; }
stamp "3. kernels' own times at batches 1 and 16 (PDL and side stream off)"
for bt in 1 16; do
  (( $(date +%s) - T0 > 520 )) && { echo "skipped: time"; break; }
  TERN_PDL=0 TERN_SIDE_STREAM=0 timeout 40 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 \
    --batches $bt --steps 10 --warmup 3 --profile --profile-batches $bt --profile-top 40 > $L/profile-b$bt.log 2>&1
  echo "rc $?"; grep -A45 "profile at batch $bt," $L/profile-b$bt.log | grep -E "^\| (category|attention|moe|dense|mhc|total)|linear_exact|hc_|linear_x8" | cut -c1-140
done
stamp "4. H200 only: the FP4 decode probe (the e4m3 MoE decode question, docs/cuda-backend.md)"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && (( $(date +%s) - T0 < 540 )); then
  timeout 45 $G/tern_gpu_bench --only decode_probe > $L/decode-probe.log 2>&1; echo "rc $?"; grep "^|" $L/decode-probe.log | head -12
fi
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
