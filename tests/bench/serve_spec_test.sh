#!/usr/bin/env bash
# End to end: `tern bench` against real `tern serve` processes on loopback reads the server's
# GET /metrics around each run.
# 1. The embedded tiny model without --speculative: the report must say there was no speculation (JSON
#    "speculative" null with tern.speculative_note, or an object with 0 drafts), and the text the
#    matching line; --no-server-metrics skips the GETs.
# 2. A synthesized tiny model with its MTP layer, `--speculative mtp` with the benchmarks-only oracle
#    acceptance: the JSON figures must equal the counter differences this script reads itself around
#    the run (no warm-up, so both cover the same requests) and vLLM's formulas.
# Usage: serve_spec_test.sh TERN OUT_DIR
set -euo pipefail
tern=$1 out=$2
rm -rf "$out" && mkdir -p "$out"
server=
trap '[[ -n $server ]] && kill $server 2>/dev/null || true' EXIT

# serve LOG ARGS...: starts tern serve on a free port, sets $server and $url once it is ready.
serve() {
  local log=$1
  shift
  "$tern" serve --port 0 --max-model-len 2048 "$@" >"$log" 2>&1 &
  server=$!
  # The first start synthesizes the embedded model into ~/.cache/tern: allow minutes.
  for _ in $(seq 600); do
    grep -q "ready: serving" "$log" && break
    kill -0 $server 2>/dev/null || { cat "$log"; echo "FAIL: tern serve exited"; exit 1; }
    sleep 1
  done
  url=$(grep -o "ready: serving [^ ]* at http://[^ ]*" "$log" | awk '{print $5}')
  [[ -n $url ]] || { cat "$log"; echo "FAIL: tern serve not ready"; exit 1; }
}
stop() { kill $server && wait $server 2>/dev/null || true; server=; }
bench() {
  timeout 300 "$tern" bench --base-url "$url" --num-prompts 4 --random-input-len 16 --random-output-len 24 \
    --range-semantics vllm --ignore-eos --max-concurrency 2 --no-progress "$@"
}

# 1. No speculation.
serve "$out/serve-plain.log"
bench --warmup-requests 1 --output-file "$out/plain.jsonl" | tee "$out/plain.txt"
grep -q "^Successful requests: *4$" "$out/plain.txt"
python3 - "$out/plain.jsonl" "$out/plain.txt" <<'PY'
import json, sys
result = json.loads(open(sys.argv[1]).readline())
text = open(sys.argv[2]).read()
assert "mean_ttft_ms" in result and "speculative" in result, "JSON keys missing"
spec = result["speculative"]
if spec is None:
    note = result["tern"]["speculative_note"]
    line = f"speculative decoding: not reported by the server ({note})"
    assert note and line in text, f"text report lacks: {line}"
    print("plain server: not reported:", note)
else:
    assert spec["source"] == "tern" and spec["run_delta"], spec
    assert spec["drafts"] == 0 and spec["acceptance_length"] is None, spec
    assert "Drafts:" in text and "no drafts" in text, "text report lacks the zero-draft block"
    print("plain server: reported with 0 drafts")
PY
grep -q "speculative decoding: not reported by the server (GET /metrics not read: --no-server-metrics)" \
  <("$tern" bench --base-url "$url" --num-prompts 1 --random-input-len 8 --random-output-len 2 --no-progress \
      --warmup-requests 0 --no-server-metrics)
stop

# 2. Speculation with the MTP layer (random weights: the oracle makes acceptance non-zero).
"$tern" synth --out "$out/tiny-mtp" >"$out/synth.log" 2>&1
serve "$out/serve-spec.log" --model "$out/tiny-mtp" --speculative mtp --num-speculative-tokens 3 \
  --speculative-oracle-accept 0.7
curl -sf "$url/metrics" >"$out/before.prom"
bench --warmup-requests 0 --output-file "$out/spec.jsonl" | tee "$out/spec.txt"
curl -sf "$url/metrics" >"$out/after.prom"
stop
python3 - "$out" <<'PY'
import json, re, sys
out = sys.argv[1]
def counters(path):
    c = {}
    for line in open(path):
        m = re.match(r'tern:spec_decode_num_(\w+)\{([^}]*)\} (\S+)$', line)
        if m:
            pos = re.search(r'position="(\d+)"', m[2])
            key = (m[1], pos[1] if pos else None)
            c[key] = c.get(key, 0) + float(m[3])
    return c
before, after = counters(f"{out}/before.prom"), counters(f"{out}/after.prom")
d = {k: after[k] - before.get(k, 0) for k in after}
spec = json.loads(open(f"{out}/spec.jsonl").readline())["speculative"]
text = open(f"{out}/spec.txt").read()
drafts, tokens, accepted = d[("drafts_total", None)], d[("draft_tokens_total", None)], d[("accepted_tokens_total", None)]
assert drafts > 0 and accepted > 0, d
assert (spec["drafts"], spec["draft_tokens"], spec["accepted_tokens"]) == (drafts, tokens, accepted), (spec, d)
assert abs(spec["acceptance_rate"] - accepted / tokens) < 1e-12, spec
assert abs(spec["acceptance_length"] - (1 + accepted / drafts)) < 1e-12, spec
per_pos = [d[("accepted_tokens_per_pos_total", str(i))] / drafts for i in range(3)]
assert spec["per_position_acceptance_rate"] == per_pos, (spec, per_pos)
assert "Speculative Decoding" in text and f"{accepted / tokens * 100:.2f}" in text, text
print(f"speculating server: {drafts:.0f} drafts, acceptance {accepted / tokens:.3f}, length {1 + accepted / drafts:.2f}, "
      f"per position {[round(p, 3) for p in per_pos]}")
PY
echo "tern bench reported the real servers' speculative decoding"
