#!/usr/bin/env bash
# Next session's third call (written in session 21; #14 item 7, "1M at batch 1"): a whole call for batch 1 at a 1M-token
# context. Session 21 stopped it at 300 s during the prefill (64K took 9.9 s; a 1M prefill's attention and indexer
# work per token grows with the context, so ~300-500 s are expected). Decode at 1K in the same run for the ratio.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s23.tar.xz}
source scripts/plans/env.sh
stamp "batch 1 at 1M context (and 1K)"
timeout 570 $T bench-step --device cuda --config full --batches 1 --contexts 1024,1048576 --prefill 1024 \
  --prefill-chunk 8192 --steps 5 --warmup 2 > $OUT/bs-1m.log 2>&1; echo "rc $?"
grep -E "state per|^(decode|prefill) |refused|needed|error" $OUT/bs-1m.log | head -8
stamp done
