#!/usr/bin/env bash
# Next session's second call (written in session 19): prefill GEMMs of #15 against the library in the same run, with
# the FP8 products on cuBLASLt's block-scaled FP8 (default) and on cuBLAS bf16 over the dequantised x and expanded
# weights (TERN_FP8_LIBRARY=0): session 19's H100 rows at 1K had wq_a+wkv at 57% and wo_a (8 groups) at 46% of the
# library's rate, under the issue's 70%. Then long contexts (#14 item 7) and the 8K prefill's profile.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s20.tar.xz}
source scripts/plans/env.sh
for L in 1024 8192; do
  for fp8 in 1 0; do
    stamp "prefill GEMMs at $L, TERN_FP8_LIBRARY=$fp8"
    TERN_FP8_LIBRARY=$fp8 timeout 120 $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill $L \
      --steps 3 --warmup 1 > $OUT/gemm-$L-$fp8.log 2>&1; echo "rc $?"
    grep -E "^prefill |^\| (attn|ffn|routed)" $OUT/gemm-$L-$fp8.log | tail -14
  done
done
stamp "long contexts (#14 item 7): 64K and 128K at batch 1 / 16, prefilled in 8K chunks"
timeout 240 $T bench-step --device cuda --config full --batches 1,16 --contexts 65536,131072 --prefill 65536 \
  --prefill-chunk 8192 --steps 5 --warmup 2 > $OUT/bs-long.log 2>&1; echo "rc $?"
grep -E "state per|^(decode|prefill) |refused|needed" $OUT/bs-long.log | head -12
stamp "8K prefill profile"
timeout 150 $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 8192 --profile \
  --profile-batches 1 --profile-top 30 --steps 3 --warmup 1 > $OUT/prefill-profile.log 2>&1; echo "rc $?"
grep -A45 "profile of the prefill of 8192" $OUT/prefill-profile.log | head -50
stamp done
