#!/usr/bin/env bash
# Session 32, call 1 (written in session 31, whose device time ran out): pack s32a = a gpu-pack of the code at or after
# d03d937 (`scripts/gpu-pack build-cuda`, copied to .plans/packs/s32a.tar.xz); carry [".plans"]. Then, on the warm
# machine, #17's closing op tests: `scripts/gpu-check --server --no-bench --no-sanitizers build-cuda` with carry
# [".whl"] (~8 minutes: every op test, the model tests, the server tests).
#   0. tests: the prefill attention (the q-norm fold's bits against norm_rope then the op, every version; the FP8
#      epilogue), the model tests (the fold is on by default again, session 31);
#   1. the batch-16 decode timeline with the graphs' edges (3130901: the edge data asked for; session 31's first hook
#      stopped bench-step), through trace-chain's critical path: the check that the records' node ids are the ids
#      the edges name, and the path's costs by kernel (the decode items of #14);
#   2. TERN_EXACT_PATH=tc against auto (the router gate's 85 exact products on the tensor-core kernel instead of
#      linear_exact_rows, 12.3 us a call at batch 16 on the H100), decode at 1 / 16 / 64, two rounds;
#   2b. TERN_Q_NORM_FOLD=0 against the default (on): the q-norm fold alone, prefill 1K and 8K, two rounds
#      (predicted from session 30's call 3 less the epilogue's sines: 8K -10 to -20 ms on the H100, norm_rope's q pass
#      ~0.5 ms a layer gone against ~0.1 ms more in the attention kernel's q load);
#   3. the tile read probe (`tern_gpu_bench --only tile_probe`, session 31): the grouped MoE kernels' 256 rows x 64
#      bytes a stage against longer runs a row at the same 16 KB stage: if 64-byte runs read at ~60% of copy and 512
#      or 2 048 at ~90%, DRAM locality is the 1K MoE's ceiling and the next step is the weights' layout (or stages of
#      fewer rows and longer runs), not the kernel's depth (4 stages measured slower in session 31);
#   4. ncu stall reasons of the 1K prefill's attention kernel and of its grouped MoE up kernel (session 31's were cut
#      by the call's limit): what holds a block of 8 warps an SM (attention: 68.6% of cycles with no eligible warp)
#      and the 2 blocks of 4 warps (MoE: 54.5%).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s32a.tar.xz
source scripts/plans/env.sh
L=$OUT
P=$(mktemp -d)
stamp "0. tests"
timeout 150 $G/tern_gpu_tests --gtest_filter='*GpuAttentionPrefill*:*GroupedFromFp8Rows*' > $P/ops.log 2>&1
echo "rc $?"; pf $P/ops.log 8; grep -c "^\[       OK" $P/ops.log
timeout 150 $G/tern_gpu_model_tests --gtest_filter='*GpuModel_.*:*GpuGraphs_.ReplayEqualsEager*:-*Speed*' \
  > $P/model.log 2>&1; echo "rc $?"; pf $P/model.log 8; grep -c "^\[       OK" $P/model.log
stamp "1. batch-16 timeline with edges"
TERN_PROFILE_TRACE=$OUT/b16.tsv timeout 90 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 \
  --batches 16 --steps 4 --warmup 3 --profile --profile-batches 16 --profile-top 12 > $L/b16.log 2>&1; echo "rc $? (trace)"
tail -3 $L/b16.log | cut -c1-200
grep -c "^edge" $OUT/b16.tsv; grep "^# graph" $OUT/b16.tsv | sort | uniq -c | head -5
python3 scripts/trace-chain $OUT/b16.tsv --session 2 --top 30 > $L/b16-chain.txt 2>&1; echo "rc $? (chain)"
head -2 $L/b16-chain.txt; tail -31 $L/b16-chain.txt
gzip $OUT/b16.tsv
stamp "2. TERN_EXACT_PATH=tc / auto"
for r in 1 2; do
  for v in auto tc; do
    TERN_EXACT_PATH=$v timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 \
      --batches 1,16,64 --steps 12 --warmup 3 > $P/x-$r-$v.log 2>&1; echo "rc $? ($r $v)"
    grep -hE "^decode |error" $P/x-$r-$v.log | cut -c1-110
  done
done
stamp "2b. TERN_Q_NORM_FOLD=0 / on"
for r in 1 2; do
  for v in 0 1; do
    for p in 1024 8192; do
      TERN_Q_NORM_FOLD=$v timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill $p \
        --batches 1 --steps 2 --warmup 1 > $P/qf-$r-$v-$p.log 2>&1; echo "rc $? ($p $r fold=$v)"
      grep -hE "^prefill \||error" $P/qf-$r-$v-$p.log | cut -c1-100
    done
  done
done
stamp "3. tile read probe"
timeout 120 $G/tern_gpu_bench --only tile_probe > $L/tile-probe.log 2>&1; echo "rc $?"
grep -E "^\||copy bandwidth" $L/tile-probe.log | head -30
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
stamp done
