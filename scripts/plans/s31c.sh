#!/usr/bin/env bash
# Session 31, call 5: pack s31d = the profiler's graph edges on top of 0b7e9db (moe_grouped's 32 / 64-pair tiles with 4
# stages, were 3) against s31b = cd1c701 (base); carry [".plans"]. Trimmed to ~4 minutes (device time: five starts
# failed); the steps in order of need (the ncu runs last). (Pack s31c = 0b7e9db alone never ran: starts failed.)
#   1. tests: the grouped MoE against the CPU and the library (every tile; the model tests' tiny fixtures never take
#      the grouped kernels: left out for device time);
#   2. prefill base / new, two rounds at 1K and 2K (1K takes the 32 x 256 tiles, 2K the 64 x 128; 8K the wgmma
#      kernel, untouched). Predicted at 1K: up 1 306 -> ~1 000 us, down 682 -> ~550 us a layer, 0.161 -> ~0.141 s;
#   3. ncu of the new 1K up and down kernels (DRAM share, stalls);
#   4. the batch-16 timeline with the graphs' edges, through trace-chain's critical path.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s31d.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s31b.tar.xz build-base
L=$OUT
P=$(mktemp -d)
stamp "1. tests"
timeout 200 $G/tern_gpu_tests --gtest_filter='*GpuMoeGrouped*' > $L/ops.log 2>&1
echo "rc $?"; pf $L/ops.log 8; grep -c "^\[       OK" $L/ops.log
stamp "2. prefill base / new"
for r in 1 2; do
  for b in base cuda; do
    for p in 1024 2048; do
      timeout 100 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill $p --batches 1 \
        --steps 2 --warmup 1 > $P/pf-$r-$b-$p.log 2>&1; echo "rc $? ($p $r $b)"
      grep -hE "^prefill \||error" $P/pf-$r-$b-$p.log | cut -c1-100
    done
  done
done
stamp "4. batch-16 timeline with edges"
TERN_PROFILE_TRACE=$OUT/b16.tsv timeout 80 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 \
  --batches 16 --steps 4 --warmup 3 --profile --profile-batches 16 --profile-top 12 > $P/b16.log 2>&1; echo "rc $? (trace)"
grep -c "^edge" $OUT/b16.tsv; grep -c "^# graph" $OUT/b16.tsv
python3 scripts/trace-chain $OUT/b16.tsv --session 2 --top 30 > $L/b16-chain.txt 2>&1; echo "rc $? (chain)"
head -3 $L/b16-chain.txt; tail -32 $L/b16-chain.txt
gzip $OUT/b16.tsv
stamp "3. 1K profile (new) and ncu of the grouped kernels"
timeout 120 $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 1024 --profile \
  --profile-top 12 > $L/pf1k-profile.log 2>&1; echo "rc $?"
grep -E "^prefill \||moe_grouped" $L/pf1k-profile.log | sort -u | head -6 | cut -c1-150
timeout 150 ncu --clock-control none --kernel-name regex:"moe_grouped_kernel" --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
  --section MemoryWorkloadAnalysis -o $P/moe1k \
  $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 1024 --steps 1 --warmup 0 \
  > $P/ncu.log 2>&1; echo "rc $?"
timeout 60 ncu -i $P/moe1k.ncu-rep --page details > $L/ncu-details.txt 2>&1
timeout 60 ncu -i $P/moe1k.ncu-rep --page raw --csv > $L/ncu-moe-raw.csv 2>&1
grep -E "moe_grouped|Duration|DRAM Through|Compute \(SM\) Through|Registers Per|Achieved Occ|No Eligible|Issued Warp|Dynamic Shared" \
  $L/ncu-details.txt | head -24
stamp "3b. ncu of the prefill attention at 1K (stall reasons)"
timeout 150 ncu --clock-control none --kernel-name regex:"attention_prefill_wgmma" --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats -o $P/att1k \
  $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 1024 --steps 1 --warmup 0 \
  > $P/ncu-att.log 2>&1; echo "rc $?"
timeout 60 ncu -i $P/att1k.ncu-rep --page raw --csv > $L/ncu-att-raw.csv 2>&1
python3 - $L/ncu-att-raw.csv <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
for h, v in zip(rows[0], rows[2] if len(rows) > 2 else []):
    if 'stalled' in h and 'per_warp_active' in h or h.startswith('gpu__time_duration'): print(h, v)
PY
stamp done
