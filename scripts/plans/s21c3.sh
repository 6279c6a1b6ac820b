#!/usr/bin/env bash
# Next session's third call (written in session 20): #14's done-when rows not measured since session 16 / ever:
# NVFP4 against MXFP4 at batch 1 / 16 / 64 / 256 (issue: within 5%), batch 256 (issue: 6 000 tokens/s on the H200),
# and batch 1 at a 1M-token context (issue: >= 80% of its 1K rate; prefilled in 8K chunks: ~2 minutes at 9-10K
# tokens/s), then MTP through the server (s20c3.sh's body, on this pack).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s21.tar.xz}
source scripts/plans/env.sh
for fmt in mxfp4 nvfp4; do
  stamp "decode $fmt at 1,16,64,256"
  timeout 100 $T bench-step --device cuda --config full --experts $fmt --batches 1,16,64,256 --contexts 1024 \
    --prefill 1024 --steps 10 --warmup 3 > $OUT/bs-$fmt.log 2>&1; echo "rc $?"
  grep -E "^decode |^prefill " $OUT/bs-$fmt.log | head -6
done
stamp "decode 128,256 with the e4m3 grouped kernels (the grouped path from 65 tokens)"
TERN_MOE_GROUPED=e4m3 timeout 80 $T bench-step --device cuda --config full --batches 128,256 --contexts 1024 \
  --prefill 1024 --steps 10 --warmup 3 > $OUT/bs-e4m3-decode.log 2>&1; echo "rc $?"
grep -E "^decode |e4m3" $OUT/bs-e4m3-decode.log | head -6
if [[ -z "${SKIP_1M:-}" ]]; then stamp "batch 1 at 1M context (and 1K in the same run)"
timeout 300 $T bench-step --device cuda --config full --batches 1 --contexts 1024,1048576 --prefill 1024 \
  --prefill-chunk 8192 --steps 5 --warmup 2 > $OUT/bs-1m.log 2>&1; echo "rc $?"
grep -E "state per|^(decode|prefill) |refused|needed|error" $OUT/bs-1m.log | head -8
fi
stamp "MTP through the server"
TERN_PACK=$TERN_PACK timeout 200 bash scripts/plans/s20c3.sh 2>&1 | grep -E "^\[|tern:spec" | head -24
stamp done
