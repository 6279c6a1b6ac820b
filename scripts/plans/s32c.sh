#!/usr/bin/env bash
# Session 32, call 2 (decode and ncu; pack s32d, as s32d.sh): s32a's steps 1, 2 and 4 (s32a itself never ran: its
# starts failed; its prefill steps are s32d's). Carry [".plans/packs/s32d.tar.xz"].
#   1. the batch-16 decode timeline with the graphs' edges (3130901) through trace-chain's critical path: the check
#      that the records' node ids are the ids the edges name, and the path's costs by kernel (#14's decode items);
#   2. TERN_EXACT_PATH=tc against auto (the router gate's 85 exact products on the tensor-core kernel instead of
#      linear_exact_rows, 12.3 us a call at batch 16 on the H100), decode at 1 / 16 / 64, two rounds;
#   4. ncu stall reasons of the 1K prefill's attention kernel and of its grouped MoE up kernel (with the L2 hint s32d
#      found better, in TERN_MOE_L2_HINT from the caller's environment).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s32d.tar.xz
source scripts/plans/env.sh
L=$OUT
P=$(mktemp -d)
# STEPS: the steps to run (default all; session 33 ran "1" after s32d in one call, then "2 4").
want() { [[ " ${STEPS:-1 2 4} " == *" $1 "* ]]; }
if want 1; then
stamp "1. batch-16 timeline with edges"
TERN_PROFILE_TRACE=$OUT/b16.tsv timeout 90 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 \
  --batches 16 --steps 4 --warmup 3 --profile --profile-batches 16 --profile-top 12 > $L/b16.log 2>&1; echo "rc $? (trace)"
tail -3 $L/b16.log | cut -c1-200
grep -c "^edge" $OUT/b16.tsv; grep "^# graph" $OUT/b16.tsv | sort | uniq -c | head -5
python3 scripts/trace-chain $OUT/b16.tsv --session 2 --top 30 > $L/b16-chain.txt 2>&1; echo "rc $? (chain)"
head -2 $L/b16-chain.txt; tail -31 $L/b16-chain.txt
gzip $OUT/b16.tsv
fi
if want 2; then
stamp "2. TERN_EXACT_PATH=tc / auto"
for r in 1 2; do
  for v in auto tc; do
    TERN_EXACT_PATH=$v timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 \
      --batches 1,16,64 --steps 12 --warmup 3 > $P/x-$r-$v.log 2>&1; echo "rc $? ($r $v)"
    grep -hE "^decode |error" $P/x-$r-$v.log | cut -c1-110
  done
done
fi
if want 4; then
stamp "4. ncu stall reasons at 1K: attention, then the MoE up kernel"
stalls() {  # FILE: a raw ncu page, the stall columns largest first
  python3 - "$1" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
if len(rows) < 3: sys.exit("no data")
for row in rows[2:]:
    vals = []
    for h, v in zip(rows[0], row):
        if "stall" in h and "pct" not in h:
            try: vals.append((float(v.replace(",", "")), h))
            except ValueError: pass
    print(row[rows[0].index("Kernel Name")][:60] if "Kernel Name" in rows[0] else "kernel")
    for v, h in sorted(vals, reverse=True)[:14]: print(f"  {v:10.3f}  {h}")
PY
}
for k in attention_prefill_wgmma moe_grouped_kernel; do
  timeout 120 ncu --clock-control none --kernel-name regex:"$k" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats -o $P/$k \
    $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 1024 --steps 1 --warmup 0 \
    > $P/ncu-$k.log 2>&1; echo "rc $? ($k)"
  timeout 60 ncu -i $P/$k.ncu-rep --page raw --csv > $L/ncu-$k.csv 2>&1
  stalls $L/ncu-$k.csv
done
fi
stamp done
