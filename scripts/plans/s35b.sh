#!/usr/bin/env bash
# Session 35's last build, the next session's first call (pack .plans/packs/s35b.tar.xz = 3b3951e;
# carry [".plans/packs/s35b.tar.xz"]; session 35's device time ran out before it ran): the wgmma MoE kernels' ring as
# deep as shared memory allows, the up epilogue staging h 8 planes at a time (32 / 64-pair tiles 6 stages, 96 5, 112
# and 128 4; 4 at most before and 3 for 128-pair up tiles), and the next stage waited for at k-step 7, after group 7's
# issue (k-step 6 before); 128-pair tiles where 112 were picked; version 5 without the knobs; the compressor rows' two
# launches. At 112 pairs the ring is 4 stages before and after, so 8K forced to 112 against session 35 call 2's 112
# (up 3 966 / down 2 157 us a layer, 0.712 s) isolates the wait's move.
#   1. the grouped MoE tests (every tile width against the CPU and the library; the e4m3 kernels, whose h staging
#      shrank too), version 5's, the GPU model tests;
#   2. the prefill at 8K (128-pair tiles, now 4 stages; session 35 call 2: 0.707 s forced to 128, up 3 869 / down
#      2 125 us a layer), 2K (64, now 6 stages; call 3: 0.235 s, up 1 899 / down 1 011), 4K (128; call 3: 0.376 s),
#      1K, two rounds of 8K and 2K; 8K forced to 112 pairs (the wait's move alone, see above);
#   3. ncu of the 8K up kernel (128 pairs, 4 stages): whether the consumers' wait for the next stage (call 3: ~26% of
#      their time) is gone.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s35b.tar.xz
source scripts/plans/env.sh
L=$OUT
P=$(mktemp -d)
stamp "1. tests"
timeout 300 $G/tern_gpu_tests --gtest_filter='*GpuMoeGrouped*:*GpuLibrary.MoeAgainstCpu*:*GpuAttentionPrefill*:*GpuActFp8*' > $P/t.log 2>&1
echo "rc $?"; pf $P/t.log 8; grep -c "^\[       OK" $P/t.log
timeout 300 $G/tern_gpu_model_tests > $P/model.log 2>&1; echo "rc $? (model)"
pf $P/model.log 6; grep -c "^\[       OK" $P/model.log
stamp "2. prefill"
rx="moe_grouped(_wgmma)?_kernel"
for r in 1 2; do pf_rows a-$r 8192 "$rx"; pf_rows a-$r 2048 "$rx"; done
pf_rows n112 8192 "$rx" TERN_MOE_WGMMA_N=112
pf_rows a 4096 "$rx"
pf_rows a 1024 "$rx"
cp $P/pf-8192-a-1.log $L/
stamp "3. ncu of the 8K up kernel"
timeout 200 ncu --clock-control none --kernel-name regex:"moe_grouped_wgmma_kernel" --launch-count 1 --section SpeedOfLight \
  --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section SourceCounters \
  --import-source no -o $P/moe8k $T bench-step --device cuda --config full --contexts 1024 --prefill 8192 --batches 1 \
  --steps 1 --warmup 0 > $L/ncu-moe.log 2>&1; echo "rc $?"
timeout 60 ncu -i $P/moe8k.ncu-rep --page details > $L/details-moe.txt 2>&1
timeout 60 ncu -i $P/moe8k.ncu-rep --page source --csv --print-source sass > $L/sass-moe.csv 2>/dev/null
grep -E "moe_grouped|Duration|Issued Warp|No Eligible|Tensor is" $L/details-moe.txt | head -8 | cut -c1-150
stamp done
