#!/usr/bin/env bash
# The `tern` command on corrupt checkpoints: exit code 1 (an error, not a crash) and a message that
# names the file and the tensor or field. Usage: cli_corrupt_checkpoint.sh TERN WORKDIR
set -uo pipefail
TERN=$1
WORK=$2
rm -rf "$WORK" && mkdir -p "$WORK"
failures=0

# expect_error NAME DIR TEXT...: `tern inspect --model DIR` must exit 1 with every TEXT in stderr.
expect_error() {
  local name=$1 dir=$2
  shift 2
  "$TERN" inspect --model "$dir" >"$WORK/out" 2>"$WORK/err"
  local rc=$?
  if [ $rc -ne 1 ]; then
    echo "FAIL $name: exit code $rc, expected 1"; cat "$WORK/err"; failures=$((failures + 1)); return
  fi
  for text in "$@"; do
    if ! grep -qF -- "$text" "$WORK/err"; then
      echo "FAIL $name: stderr lacks '$text':"; cat "$WORK/err"; failures=$((failures + 1)); return
    fi
  done
  echo "ok   $name: $(head -c 300 "$WORK/err")"
}

fresh() {  # fresh NAME SHARDS: a copy of the good checkpoint
  rm -rf "$WORK/$1" && cp -r "$WORK/good$2" "$WORK/$1"
}

"$TERN" synth --out "$WORK/good1" --vocab 512 --seed 3 >/dev/null || { echo "FAIL: tern synth"; exit 1; }
"$TERN" synth --out "$WORK/good2" --vocab 512 --seed 3 --shards 2 --experts nvfp4 >/dev/null || exit 1
"$TERN" inspect --model "$WORK/good1" >"$WORK/out" || { echo "FAIL: inspect of a good checkpoint"; exit 1; }
grep -q "tensors:" "$WORK/out" || { echo "FAIL: inspect output"; cat "$WORK/out"; exit 1; }
"$TERN" inspect --model "$WORK/good2" >/dev/null || { echo "FAIL: inspect of a good sharded checkpoint"; exit 1; }

# Header length far past the end of the file.
fresh len 1
printf '\xff\xff\xff\x00\x00\x00\x00\x00' | dd of="$WORK/len/model.safetensors" bs=1 count=8 conv=notrunc status=none
expect_error header-length "$WORK/len" "$WORK/len/model.safetensors" "header length"

# Truncated data section.
fresh trunc 1
size=$(stat -c %s "$WORK/trunc/model.safetensors")
truncate -s $((size - 1000)) "$WORK/trunc/model.safetensors"
expect_error truncated "$WORK/trunc" "$WORK/trunc/model.safetensors" "tensor \"" "truncated"

# An unknown dtype string in the header (same length, so offsets stay valid).
fresh dtype 1
sed -i '0,/"F8_E4M3"/s//"F8_E5M2"/' "$WORK/dtype/model.safetensors"
expect_error dtype "$WORK/dtype" "$WORK/dtype/model.safetensors" "tensor \"" "unknown dtype \"F8_E5M2\""

# A tensor's shape changed in the header (bf16 [256] -> [128] is also a size mismatch).
fresh shape 1
python3 - "$WORK/shape/model.safetensors" <<'PY' || sed -i 's/"shape":\[256\],"data_offsets"/"shape":\[255\],"data_offsets"/' "$WORK/shape/model.safetensors"
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
i = b.find(b'"shape":[256],"data_offsets"')
b[i:i + 13] = b'"shape":[255]'
open(p, "wb").write(b)
PY
expect_error shape "$WORK/shape" "$WORK/shape/model.safetensors" "tensor \"" "bytes, but BF16 [255] needs 510"

# A shard missing from a sharded checkpoint.
fresh shard 2
rm "$WORK/shard/model-00002-of-00002.safetensors"
expect_error missing-shard "$WORK/shard" "model.safetensors.index.json" "model-00002-of-00002.safetensors" "does not exist"

# A bad config field.
fresh config 1
sed -i 's/"o_groups": 2/"o_groups": 3/' "$WORK/config/config.json"
expect_error config "$WORK/config" "$WORK/config/config.json" "field \"o_groups\""

# The config disagrees with the tensors.
fresh mismatch 1
sed -i 's/"q_lora_rank": 128/"q_lora_rank": 64/' "$WORK/mismatch/config.json"
expect_error mismatch "$WORK/mismatch" "$WORK/mismatch/model.safetensors" "tensor \"layers.0.attn.wq_a.weight\": expected shape [64, 256], found [128, 256]"

# Not a checkpoint directory at all.
expect_error no-dir "$WORK/nonexistent" "$WORK/nonexistent/config.json"

rm -rf "$WORK"
[ $failures -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all CLI corruption cases give exit code 1 with the file and tensor named"
