#!/usr/bin/env bash
# Session 31, call 1: session 30's call 4 (s30c4.sh) on pack s31a = 3bb4c44 (cd8c908 + the rotate_back_in_kernel refactor), plus a batch-16 timeline.
# 34ba730, the base, and s30e = cd8c908 (or a fresh `scripts/gpu-pack` of the current code as s30e): call 3's code
# with the q-norm fold removed again (it cost the attention kernel ~1.66 ms a layer at 8K with its sines once a query
# too: not the sines); the prefill chunk's heads rotated back and quantised for wo_a in the wgmma kernels' epilogue
# stay; carry [".plans"]. Then, on the warm machine, #17's closing check with carry [".whl"]:
# scripts/gpu-check --model-only --server --no-bench --no-sanitizers build-cuda.
#   1. tests on s30e: the prefill attention and wo_a from FP8 rows; the model tests;
#   2. prefill base / new, two rounds at 1K and 8K (predicted from call 3's profiles: 8K -25 to -30 ms of ~776:
#      act_quant -21.5, rope -5, the heads' f32 writes; 1K -2 to -4 ms);
#   3. the new 8K prefill's profile (the attention kernel back at ~3.37 ms a layer, act_quant ~14 ms);
#   4. ncu on the 1K context prefill's grouped MoE kernels on mma.sync (moe_grouped_kernel, layer 1's up and down:
#      every expert is read at 1K tokens, ~58% of copy, session 29).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s31a.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s29c.tar.xz build-base
L=$OUT
P=$(mktemp -d)
stamp "1. tests"
timeout 150 $G/tern_gpu_tests --gtest_filter='*GpuAttentionPrefill*:*GroupedFromFp8Rows*' > $L/ops.log 2>&1
echo "rc $?"; pf $L/ops.log 8; grep -c "^\[       OK" $L/ops.log
timeout 150 $G/tern_gpu_model_tests --gtest_filter='*GpuModel_.*:*GpuGraphs_.ReplayEqualsEager*:-*Speed*' \
  > $L/model.log 2>&1; echo "rc $?"; pf $L/model.log 8; grep -c "^\[       OK" $L/model.log
stamp "2. prefill base / new"
for r in 1 2; do
  for b in base cuda; do
    for p in 1024 8192; do
      timeout 100 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill $p --batches 1 \
        --steps 2 --warmup 1 > $P/pf-$r-$b-$p.log 2>&1; echo "rc $? ($p $r $b)"
      grep -hE "^prefill \||error" $P/pf-$r-$b-$p.log | cut -c1-100
    done
  done
done
stamp "3. 8K prefill profile (new)"
timeout 120 $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 8192 --profile \
  --profile-top 40 > $L/pf8k-profile.log 2>&1; echo "rc $?"
grep -E "^prefill \||attention_prefill|act_quant|act_dequant|rope_kernel|norm_rope" $L/pf8k-profile.log | sort -u | head -12 | cut -c1-150
stamp "4. ncu moe_grouped_kernel at 1K"
timeout 150 ncu --clock-control none --kernel-name regex:"moe_grouped_kernel" --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
  --section MemoryWorkloadAnalysis -o $P/moe1k \
  $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 1024 --steps 1 --warmup 0 \
  > $P/ncu.log 2>&1; echo "rc $?"
tail -1 $P/ncu.log
timeout 60 ncu -i $P/moe1k.ncu-rep --page details > $L/ncu-details.txt 2>&1
grep -E "moe_grouped|Duration|DRAM Through|Compute \(SM\) Through|Registers Per|Achieved Occ|Eligible Warps|No Eligible|Issued Warp|Block Limit (Reg|Shared)" \
  $L/ncu-details.txt | head -30

stamp "5. batch-16 decode timeline (trace-chain)"
TERN_PROFILE_TRACE=$OUT/b16.tsv timeout 80 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 \
  --batches 16 --steps 4 --warmup 3 --profile --profile-batches 16 --profile-top 12 > $L/b16.log 2>&1; echo "rc $? (trace)"
python3 scripts/trace-chain $OUT/b16.tsv --session 2 --top 25 > $L/b16-chain.txt 2>&1; echo "rc $? (chain)"
tail -30 $L/b16-chain.txt
gzip $OUT/b16.tsv
stamp done
