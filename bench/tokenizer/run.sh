#!/usr/bin/env bash
# Tokenizer encode throughput, tern vs Hugging Face tokenizers, side by side on one CPU core, on the
# comparison corpus (tests/tokenizer/pyref) with the DeepSeek-V4 tokenizer (and the second one).
#   bench/tokenizer/run.sh [BUILD_DIR] [SECONDS]      (BUILD_DIR default: build; needs bench_tokenizer built)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
seconds=${2:-3}
bin=$build/tests/tokenizer/bench_tokenizer
[[ -x $bin ]] || { echo "build it first: cmake --build $build --target bench_tokenizer" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$root/tests/tokenizer/pyref/prepare.sh" "$work" > /dev/null
core=$(taskset -cp $$ | awk -F': ' '{print $2}' | cut -d, -f1 | cut -d- -f1)
for name in deepseek_v4 claude; do
  path=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$work/tokenizers.json" "$name")
  echo "== $name ($(du -h "$work/corpus.jsonl" | cut -f1) corpus, core $core)"
  taskset -c "$core" "$bin" "$path" "$work/corpus.jsonl" "$seconds"
  RAYON_NUM_THREADS=1 taskset -c "$core" python3 "$root/bench/tokenizer/bench_hf.py" "$path" "$work/corpus.jsonl" "$seconds"
done
