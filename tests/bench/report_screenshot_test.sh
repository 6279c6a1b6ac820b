#!/usr/bin/env bash
# End to end: the `tern` command runs a concurrency sweep against the test server on loopback, writes
# JSON lines and the HTML report, rebuilds the report from the JSON, and headless Chromium renders it;
# png_check.py checks the screenshot shows the plots. Exit 77 (skipped) when Chromium is missing.
# Usage: report_screenshot_test.sh TERN FAKE_SERVER OUT_DIR
set -euo pipefail
tern=$1 fake=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
browser=$(command -v chromium || command -v chromium-browser || true)
if [[ -z $browser ]]; then echo "SKIP: chromium not installed (scripts/setup-test-deps installs it)"; exit 77; fi
rm -rf "$out" && mkdir -p "$out"

coproc SERVER { exec "$fake" 20000 5000; }
trap 'kill $SERVER_PID 2>/dev/null || true' EXIT
read -r port <&"${SERVER[0]}"

"$tern" bench --base-url "http://127.0.0.1:$port" --num-prompts 48 --random-input-len 32 --random-output-len 16 \
  --sweep-concurrency 1,4,16 --slo ttft:100,tpot:20 --no-progress \
  --output-file "$out/result.jsonl" --output-details --html "$out/report.html" | tee "$out/stdout.txt"
grep -q "| Configuration | Throughput (tok/s) | TPOT (ms) | TTFT (ms) |" "$out/stdout.txt"
grep -q "| C=16 |" "$out/stdout.txt"
[[ $(wc -l < "$out/result.jsonl") -eq 3 ]]

"$tern" bench --report-from "$out/result.jsonl" --html "$out/rebuilt.html"
grep -q "<svg" "$out/rebuilt.html"

# --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,2600 \
  --screenshot="$out/report.png" "file://$out/report.html" 2>"$out/chromium.log" || { cat "$out/chromium.log"; exit 1; }
python3 "$here/png_check.py" "$out/report.png"
echo "report rendered: $out/report.png"
