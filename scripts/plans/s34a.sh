#!/usr/bin/env bash
# Written in session 33 for the next session's first call (pack .plans/packs/s34a.tar.xz: `scripts/gpu-pack
# build-cuda` of HEAD, copied there; carry [".plans/packs/s34a.tar.xz"]). The questions session 33 left open:
#   (step 5 runs first: the one code change waiting)
#   1. where the 1K grouped MoE up kernel's issue slots go: ncu source counters (stall reasons by SASS line) on the
#      default 32 x 256 tile and on 8-warp-32 (session 33: twice the warps bought 1-3%, so not latency hiding);
#   2. 8-warp-32 on NVFP4 experts (the 1K prefill with --experts nvfp4, default / 8-warp-32; session 33 timed MXFP4
#      only), to decide its default;
#   3. the Sinkhorn apart at prefill: TERN_HC_COMB_APART 8 (default) / 1048576 at 1K and 8K, with the profile's
#      hc_pre_finish rows (session 33: hc_pre_finish 53 us a call at 1K, 86 calls, where its 64 MB of streams take
#      ~21 us at copy; the finish block's warp 8 runs 20 Sinkhorn rounds before the block can retire);
#   4. ncu of hc_pre_finish and hc_post_squares at 8K (DRAM %, occupancy, stalls);
#   5. the finish kernels at D's slice (session 33's last change: hc_pre_finish<4>, 96 registers, two blocks an SM,
#      where one launch took kHcMaxD's 164): GpuV4.Mhc and GpuLibrary.MhcAgainstCpu, then TERN_HC_FINISH_WIDE 1 / 0
#      at 1K and 8K with the profile's hc_pre_finish rows (predicted: 53 -> ~27-30 us a call at 1K, the 1K prefill
#      -1 to -1.5%, 8K -1.5 to -2.5%); the same runs show moe_grouped_gather_kernel, rewritten in session 33 with a
#      thread a 16-byte chunk (coalesced; no knob: session 33 measured 71.5 us a call at 1K on the H100, 31% of copy;
#      predicted ~30 us), moe_combine_kernel<4> (four d a thread; session 33: 55.9 us a call at 1K, ~69% of copy;
#      predicted ~42) and the wgmma path's gather (8K; not changed: its stores are 4-byte words 16 planes apart).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s34a.tar.xz
source scripts/plans/env.sh
L=$OUT
P=$(mktemp -d)
# STEPS (default "5 m 1 2 3 4") picks the steps and their order (one call may run 10 minutes; session 34 split it).
step5() {
stamp "5. the finish kernels' slice: tests, then TERN_HC_FINISH_WIDE 1 / 0"
timeout 120 $G/tern_gpu_tests --gtest_filter='*GpuV4.Mhc*:*GpuLibrary.MhcAgainstCpu*' > $L/mhc-tests.log 2>&1; rc=$?
echo "rc $rc"; pf $L/mhc-tests.log 8; grep -c "^\[       OK" $L/mhc-tests.log
if [[ $rc -eq 0 ]]; then
  for p in 1024 8192; do
    for v in 1 0; do
      TERN_HC_FINISH_WIDE=$v timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill $p \
        --batches 1 --steps 2 --warmup 1 --profile --profile-top 30 > $P/fw-$p-$v.log 2>&1; echo "rc $? ($p wide=$v)"
      grep -hE "^prefill \||error" $P/fw-$p-$v.log | head -1 | cut -c1-100
      grep -hE "^\| (hc_pre_finish|moe_grouped_gather|moe_grouped_wgmma_gather|moe_combine)" $P/fw-$p-$v.log | head -4 | cut -c1-130
    done
  done
fi
}
stepm() {
stamp "m. the gather / combine changes: the grouped MoE and GpuV4 suites"
timeout 240 $G/tern_gpu_tests --gtest_filter='*GpuMoeGrouped*:*GpuLibrary.MoeAgainstCpu*:*GpuV4*' > $L/moe-tests.log 2>&1
echo "rc $?"; pf $L/moe-tests.log 8; grep -c "^\[       OK" $L/moe-tests.log
}
step1() {
stamp "1. ncu source counters, 1K up kernel: default / 8-warp-32"
for v in default 8-warp-32; do
  TERN_MOE_GROUPED_TILE=$v timeout 150 ncu --clock-control none --kernel-name regex:"moe_grouped_kernel" \
    --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --section SourceCounters --import-source no -o $P/src-$v \
    $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 1024 --steps 1 --warmup 0 \
    > $P/ncu-$v.log 2>&1; echo "rc $? ($v)"
  timeout 60 ncu -i $P/src-$v.ncu-rep --page source --csv --print-source sass > $L/sass-$v.csv 2>/dev/null
  timeout 60 ncu -i $P/src-$v.ncu-rep --page details > $L/details-$v.txt 2>&1
  grep -E "Issue Slots Busy|Executed Ipc Active|DRAM Throughput|L2 Hit Rate|Eligible Warps|No Eligible|Warp Cycles Per Issued" \
    $L/details-$v.txt | head -8
done
python3 - "$L/sass-default.csv" <<'PY'
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
if not rows: sys.exit("no source rows")
keys = [k for k in rows[0] if k.startswith("stall_") or "Stall" in k or "Warp Stall Sampling" in k]
col = next((k for k in rows[0] if "Warp Stall Sampling (All" in k), None)
print("columns:", len(rows[0]), "sampling column:", col)
if col:
    top = sorted(rows, key=lambda r: -float((r.get(col) or "0").replace(",", "") or 0))[:25]
    for r in top: print(f"{r.get(col):>8}  {r.get('Source', '')[:90]}")
PY
}
step2() {
stamp "2. NVFP4 1K: default / 8-warp-32"
for v in default 8-warp-32; do
  TERN_MOE_GROUPED_TILE=$v timeout 80 $T bench-step --device cuda --config full --experts nvfp4 --contexts 1024 \
    --prefill 1024 --batches 1 --steps 2 --warmup 1 --profile --profile-top 4 > $P/nv-$v.log 2>&1; echo "rc $? ($v)"
  grep -hE "^prefill \||error" $P/nv-$v.log | head -1 | cut -c1-100
  grep -hE "^\| moe_grouped_kernel" $P/nv-$v.log | head -2 | cut -c1-130
done
}
step3() {
stamp "3. TERN_HC_COMB_APART 8 / 1048576 at 1K and 8K"
for p in 1024 8192; do
  for v in 8 1048576; do
    TERN_HC_COMB_APART=$v timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill $p \
      --batches 1 --steps 2 --warmup 1 --profile --profile-top 30 > $P/hc-$p-$v.log 2>&1; echo "rc $? ($p $v)"
    grep -hE "^prefill \||error" $P/hc-$p-$v.log | head -1 | cut -c1-100
    grep -hE "^\| (hc_pre_finish|hc_comb|hc_post_squares|hc_mix)" $P/hc-$p-$v.log | head -4 | cut -c1-130
  done
done
}
step4() {
stamp "4. ncu at 8K: hc_pre_finish, hc_post_squares"
for k in hc_pre_finish_kernel hc_post_squares_kernel; do
  timeout 120 ncu --clock-control none --kernel-name regex:"$k" --launch-skip 4 --launch-count 1 --section SpeedOfLight \
    --section Occupancy --section WarpStateStats --section LaunchStats \
    $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 8192 --steps 1 --warmup 0 \
    > $L/ncu-$k.txt 2>&1; echo "rc $? ($k)"
  grep -E "Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Size|Grid Size|Eligible Warps|Warp Cycles Per Issued" \
    $L/ncu-$k.txt | head -10
done
}
for s in ${STEPS:-5 m 1 2 3 4}; do step$s; done
stamp done
