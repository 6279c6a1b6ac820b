#!/usr/bin/env bash
# Session 27, call 6 (pack s27g, carry [".plans"]): where the bulk MoE kernels stall at T = 1, by instruction (call 4:
# up 30 us at 56% of DRAM, down 19.8 us at 42%, 32% of stall cycles on L1TEX loads). ncu's source counters with warp
# stall sampling on the first up and down launches of tern_gpu_bench --only moe --quick; the SASS page as CSV (with
# -lineinfo's source lines) comes back for reading here, with the report.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s27g.tar.xz
source scripts/plans/env.sh
stamp "ncu"
timeout 150 ncu --clock-control none --kernel-name regex:moe_bulk --launch-count 2 --section SourceCounters \
  --section WarpStateStats --section SchedulerStats --import-source yes -o $OUT/bulk \
  $G/tern_gpu_bench --only moe --quick > $OUT/ncu.log 2>&1; echo "rc $?"
tail -3 $OUT/ncu.log
timeout 60 ncu -i $OUT/bulk.ncu-rep --page source --csv --print-source sass > $OUT/src.csv 2>$OUT/src.err; echo "rc $? (source page)"
ls -la $OUT; head -c 600 $OUT/src.csv; echo; head -5 $OUT/src.err
timeout 60 ncu -i $OUT/bulk.ncu-rep --page details --section SchedulerStats --section WarpStateStats > $OUT/details.txt 2>&1
gzip $OUT/src.csv
stamp done
