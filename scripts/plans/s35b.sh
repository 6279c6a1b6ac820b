#!/usr/bin/env bash
# Session 35 (pack .plans/packs/s35b.tar.xz; carry [".plans/packs/s35b.tar.xz"]): the wgmma MoE kernels' ring as deep
# as shared memory allows, the up epilogue staging h 8 planes at a time (32 / 64-pair tiles 6 stages, 96 5, 112 and
# 128 4; 4 at most before and 3 for 128-pair up tiles), 128-pair tiles where 112 were picked; version 5 without the
# knobs; the compressor rows' two launches.
#   1. the grouped MoE tests (every tile width against the CPU and the library; the e4m3 kernels, whose h staging
#      shrank too), version 5's, the GPU model tests;
#   2. the prefill at 8K (128-pair tiles, now 4 stages; call 2: 0.707 s forced to 128, up 3 869 / down 2 125 us a
#      layer), 2K (64, now 6 stages; call 3: 0.235 s, up 1 899 / down 1 011), 8K again, 1K, 4K (trimmed to the
#      session's last device seconds).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s35b.tar.xz
source scripts/plans/env.sh
L=$OUT
P=$(mktemp -d)
stamp "1. tests"
timeout 120 $G/tern_gpu_tests --gtest_filter='*GpuMoeGrouped*:*GpuLibrary.MoeAgainstCpu*:*GpuAttentionPrefill*:*GpuActFp8*' > $P/t.log 2>&1
echo "rc $?"; pf $P/t.log 8; grep -c "^\[       OK" $P/t.log
timeout 120 $G/tern_gpu_model_tests > $P/model.log 2>&1; echo "rc $? (model)"
pf $P/model.log 6; grep -c "^\[       OK" $P/model.log
stamp "2. prefill"
run_pf() {  # NAME PREFILL ENV...
  local name=$1 p=$2; shift 2
  env "$@" timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill $p --batches 1 --steps 2 \
    --warmup 1 --profile --profile-top 60 > $P/pf-$p-$name.log 2>&1; echo "rc $? ($p $name)"
  grep -hE "^prefill \||error" $P/pf-$p-$name.log | head -1 | cut -c1-100
  grep -hE "^\| moe_grouped(_wgmma)?_kernel" $P/pf-$p-$name.log | sort -u | cut -c1-120
}
run_pf a-1 8192 X=1
run_pf a-1 2048 X=1
run_pf a-2 8192 X=1
run_pf a 1024 X=1
run_pf a 4096 X=1
cp $P/pf-8192-a-1.log $L/ 2>/dev/null
stamp done
