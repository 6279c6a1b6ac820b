#!/usr/bin/env bash
# End to end: the `tern bench` command against a faulty server on loopback (the test server process)
# and against nothing at all. Every run must end on its own (stalled streams by --timeout), report the
# failures per reason with the server's message, count them in the summary, and exit 1 when nothing
# succeeded. Usage: cli_faults_test.sh TERN FAKE_SERVER OUT_DIR
set -euo pipefail
tern=$1 fake=$2 out=$3
rm -rf "$out" && mkdir -p "$out"
coproc SERVER { exec "$fake" 2000 1000; }
trap 'kill $SERVER_PID 2>/dev/null || true' EXIT
read -r port <&"${SERVER[0]}"

# bench MODEL EXPECTED_REASON EXPECTED_MESSAGE: 6 requests, all must fail with that reason, within 20 s.
bench() {
  local model=$1 reason=$2 message=$3 rc=0 start=$SECONDS
  timeout 20 "$tern" bench --base-url "http://127.0.0.1:$port" --model "$model" --num-prompts 6 \
    --random-input-len 8 --random-output-len 4 --range-semantics vllm --warmup-requests 0 --timeout 1 --no-progress \
    >"$out/$model.txt" 2>&1 || rc=$?
  cat "$out/$model.txt"
  [[ $rc -eq 1 ]] || { echo "FAIL $model: exit code $rc, expected 1 (124: it hung)"; exit 1; }
  grep -q "^Failed requests: *6$" "$out/$model.txt" || { echo "FAIL $model: summary does not count 6 failures"; exit 1; }
  grep -q "6 x $reason\$" "$out/$model.txt" || { echo "FAIL $model: no '6 x $reason'"; exit 1; }
  grep -qF "$message" "$out/$model.txt" || { echo "FAIL $model: message '$message' missing"; exit 1; }
  echo "ok: $model -> $reason in $((SECONDS - start)) s"
}
bench stall timeout "no complete response within 1 s"
bench malformed "malformed SSE" "not a JSON object"
bench http500 "http 500" "HTTP 500: boom"
bench close "incomplete stream" "before data: [DONE]"

# A mix: the server's model list is used when --model is absent, and good requests are not hurt.
timeout 20 "$tern" bench --base-url "http://127.0.0.1:$port" --num-prompts 4 --random-input-len 8 \
  --random-output-len 4 --no-progress >"$out/discovered.txt" 2>&1
grep -q "Model: ok (the first of GET /v1/models)" "$out/discovered.txt"
grep -q "^Successful requests: *4$" "$out/discovered.txt"

# Nothing listening: a clear error at once, no hang.
free_port=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
rc=0
timeout 20 "$tern" bench --port "$free_port" --num-prompts 2 >"$out/unreachable.txt" 2>&1 || rc=$?
cat "$out/unreachable.txt"
[[ $rc -eq 1 ]] && grep -q "GET http://127.0.0.1:$free_port/v1/models failed: cannot connect" "$out/unreachable.txt"
rc=0
timeout 20 "$tern" bench --port "$free_port" --model m --num-prompts 3 --random-input-len 8 --random-output-len 4 \
  --no-progress >"$out/unreachable-model.txt" 2>&1 || rc=$?
cat "$out/unreachable-model.txt"
[[ $rc -eq 1 ]] && grep -q "3 x connect$" "$out/unreachable-model.txt"
echo "all fault runs ended, reported and counted"
