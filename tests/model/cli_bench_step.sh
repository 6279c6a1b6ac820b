#!/usr/bin/env bash
# `tern bench-step` on the CPU with the tiny shape: decode rows per batch and context, prefill rows, the
# ceilings measured in the same run, the table last and the JSON form, with figures that hold together.
set -euo pipefail
TERN=$1
OUT=$2
mkdir -p "$OUT"
"$TERN" bench-step --config tiny --batches 1,3 --contexts 40,70 --prefill 40,100 --steps 2 --warmup 1 \
  --json "$OUT/bench-step.json" >"$OUT/bench-step.log" 2>&1 || { cat "$OUT/bench-step.log"; exit 1; }
cat "$OUT/bench-step.log"
grep -q '^== bench-step results (tiny, mxfp4 experts, kv fp8, activations native, cpu' "$OUT/bench-step.log"
grep -q '^no shared storage: every layer has its own routed experts' "$OUT/bench-step.log"
# The table comes last: its final line is the 100-token prefill row.
tail -1 "$OUT/bench-step.log" | grep -q '^| 100 | '
python3 - "$OUT/bench-step.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["config"] == "tiny" and j["device"] == "cpu" and not j["shared_expert_storage"], j
assert j["activations"] == "native", j
assert j["copy_gbs"] > 0 and j["gemm_tflops"]["bf16"] > 0 and j["gemm_tflops"]["fp8"] > 0, j
rows = {(r["batch"], r["context"]): r for r in j["decode"]}
assert sorted(rows) == [(1, 40), (1, 70), (3, 40), (3, 70)], sorted(rows)
for r in rows.values():
    assert 0 < r["min_ms"] <= r["step_ms"] <= r["max_ms"], r
    assert abs(r["tokens_per_s"] - r["batch"] / (r["step_ms"] / 1e3)) < 1e-6 * r["tokens_per_s"], r
    assert abs(r["gbs"] - r["bytes_per_step"] / (r["step_ms"] / 1e3) / 1e9) < 1e-6 * r["gbs"], r
    assert abs(r["of_copy"] - r["gbs"] / j["copy_gbs"]) < 1e-9, r
    assert r["note"] == "(eager: CPU)", r
# More sequences touch more distinct experts: more bytes per step.
assert rows[(3, 40)]["bytes_per_step"] > rows[(1, 40)]["bytes_per_step"]
pre = {r["tokens"]: r for r in j["prefill"]}
assert sorted(pre) == [40, 100], sorted(pre)
assert pre[100]["flops"] > 2 * pre[40]["flops"] and all(r["seconds"] > 0 and r["tflops"] > 0 for r in pre.values())
print("bench-step CLI test: ok")
PY
# --prefill-chunk: prompts longer than the chunk go in chunks of it (one forward each), no first run; the decode
# rows at that context run on the chunked state.
"$TERN" bench-step --config tiny --batches 1 --contexts 70 --prefill 30,100 --prefill-chunk 32 --steps 2 --warmup 1 \
  --json "$OUT/bench-step-chunked.json" >"$OUT/bench-step-chunked.log" 2>&1 || { cat "$OUT/bench-step-chunked.log"; exit 1; }
grep -q '^| 100 | .* (4 chunks, no first run)$' "$OUT/bench-step-chunked.log"
python3 - "$OUT/bench-step-chunked.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
pre = {r["tokens"]: r for r in j["prefill"]}
assert pre[30]["chunks"] == 1 and pre[30]["first_run_seconds"] > 0, pre[30]
assert pre[100]["chunks"] == 4 and pre[100]["first_run_seconds"] == 0 and pre[100]["seconds"] > 0, pre[100]
assert [(r["batch"], r["context"]) for r in j["decode"]] == [(1, 70)] and j["decode"][0]["step_ms"] > 0, j["decode"]
print("bench-step --prefill-chunk: ok")
PY
# --speculative k --save-speculative-threshold: the auto threshold from the MTP rounds at the acceptance length and
# the least gain given, stored for `tern serve --speculative auto` in $TERN_CACHE.
for gain in 1.0 8.0; do
  TERN_CACHE="$OUT/cache-$gain" "$TERN" bench-step --config tiny --batches 1,3 --contexts 40 --prefill 40 --steps 2 \
    --warmup 1 --speculative 1 --speculative-acceptance 10 --speculative-min-gain $gain --save-speculative-threshold \
    >"$OUT/bench-step-spec-$gain.log" 2>&1 || { cat "$OUT/bench-step-spec-$gain.log"; exit 1; }
  grep -q "^speculative auto threshold at acceptance length 10 and a least gain of ${gain%.0}x: " "$OUT/bench-step-spec-$gain.log"
  python3 - "$OUT/cache-$gain/speculative-thresholds.json" "$gain" <<'PY'
import json, sys
[t] = json.load(open(sys.argv[1]))
gain = float(sys.argv[2])
assert t["k"] == 1 and t["acceptance_length"] == 10 and t["min_gain"] == gain, t
ratios = {r["batch"]: r["ratio"] for r in t["ratios"]}
assert sorted(ratios) == [1, 3], t
# The rule: the largest batch, from the smallest, whose predicted gain 10 / ratio is at least the least gain.
want = 0
for b in sorted(ratios):
    if 10 / ratios[b] < gain:
        break
    want = b
assert t["max_batch"] == want, t
print("threshold at least gain", gain, ":", want, ratios)
PY
done
! "$TERN" bench-step --config tiny --speculative 1 --speculative-min-gain 0.5 >"$OUT/bench-step-badgain.log" 2>&1
grep -q "speculative-min-gain" "$OUT/bench-step-badgain.log"
# --ab: the decode rows (and the prefill) again in one process, every B arm (the switches given; two arms here, the
# second with two switches) then arm A (the start-up values of every switch named) per round, graphs recorded again
# per arm; an unknown switch or a value out of range is refused before anything is timed.
"$TERN" bench-step --config tiny --batches 1,3 --contexts 40 --prefill 40 --steps 2 --warmup 1 \
  --ab TERN_HC_FOLD=0 --ab TERN_FUSED_COMPRESS=0,TERN_HC_FOLD=1 --ab-rounds 2 --json "$OUT/bench-step-ab.json" \
  >"$OUT/bench-step-ab.log" 2>&1 || { cat "$OUT/bench-step-ab.log"; exit 1; }
grep -q '^A/B in this process (--ab): B1: TERN_HC_FOLD=0; B2: TERN_FUSED_COMPRESS=0,TERN_HC_FOLD=1; A: TERN_HC_FOLD=1, TERN_FUSED_COMPRESS=1; 2 rounds' \
  "$OUT/bench-step-ab.log"
python3 - "$OUT/bench-step-ab.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
rows = {(r["switches"], r["batch"], r["context"]): r for r in j["ab"]}
arms = ["TERN_HC_FOLD=0", "TERN_FUSED_COMPRESS=0,TERN_HC_FOLD=1"]
assert sorted(rows) == sorted((a, b, 40) for a in arms for b in (0, 1, 3)), sorted(rows)  # batch 0: the prefill
for r in rows.values():
    assert len(r["a_ms"]) == 2 and len(r["b_ms"]) == 2 and min(r["a_ms"] + r["b_ms"]) > 0, r
for b in (0, 1, 3):  # arm A is run once a round and shared by the B arms' rows
    assert rows[(arms[0], b, 40)]["a_ms"] == rows[(arms[1], b, 40)]["a_ms"]
print("bench-step --ab: ok")
PY
for bad in TERN_NOPE=1 TERN_HC_FOLD=2 TERN_HC_FOLD TERN_L2_PREFETCH=8 TERN_FUSED_ROPE=-1 TERN_HC_COMB_APART=-1 TERN_HC_COMB_APART=1048577; do
  if "$TERN" bench-step --config tiny --batches 1 --contexts 40 --prefill 40 --ab "$bad" >"$OUT/bench-step-bad.log" 2>&1; then
    echo "bench-step --ab $bad: accepted"; exit 1
  fi
  grep -qE 'no switch named TERN_NOPE|takes 0 or 1, not (2|-1)|expected NAME=VALUE|TERN_L2_PREFETCH takes 0 .. 7|TERN_HC_COMB_APART takes 0 .. 1048576' \
    "$OUT/bench-step-bad.log"
done
echo "bench-step --ab refusals: ok"
