#!/usr/bin/env python3
"""Runs sglang's bench_serving (sglang.benchmark.serving) unchanged, on a machine without a GPU,
once or for several rounds in one process alternating with another benchmark command.

  compare-bench-sglang.py BENCH_SERVING_ARGS...
      one run, as `python -m sglang.benchmark.serving BENCH_SERVING_ARGS...`
  compare-bench-sglang.py --rounds N --other 'SHELL COMMAND' [--server-metrics URL --server-runs FILE]
                          BENCH_SERVING_ARGS...
      N rounds in the order sglang, other, other, sglang, sglang, other, ... (each round's two runs
      back to back), so that sglang and its tokenizer are loaded once, not once per round (about a
      minute on a small shared machine), and the two clients' runs sit close together in time.
      With --server-metrics (tern serve's /metrics), the server's own step and forward times during
      each run are appended to FILE as JSON lines: how fast the server itself was in that run.

`import sglang.benchmark.serving` pulls in sglang.srt.disaggregation.utils for one constant
(FAKE_BOOTSTRAP_HOST), and that module imports sglang's model configs, which need torchvision.
This wrapper provides that one constant instead; the benchmark code itself runs as shipped, through
its own command-line entry point (cli_main) with bench_serving's own arguments.
"""
import json
import subprocess
import sys
import types
import urllib.request

stub = types.ModuleType("sglang.srt.disaggregation.utils")
stub.FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # the value sglang defines
sys.modules["sglang.srt.disaggregation.utils"] = stub

import sglang.benchmark.serving as serving  # noqa: E402

argv, opts = sys.argv[1:], {"--rounds": "1", "--other": None, "--server-metrics": None, "--server-runs": None}
while argv and argv[0] in opts:
    opts[argv[0]], argv = argv[1], argv[2:]
rounds, other = int(opts["--rounds"]), opts["--other"]


def server_counters():
    """tern serve's step and forward time counters (seconds, counts), or None."""
    if not opts["--server-metrics"]:
        return None
    text = urllib.request.urlopen(opts["--server-metrics"], timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        for name in ("step_seconds_sum", "step_seconds_count", "model_forward_seconds_sum"):
            if line.startswith(f"tern:{name}"):
                values[name] = float(line.split()[-1])
    return values


def measured(client, r, run):
    before = server_counters()
    run()
    after = server_counters()
    if before is None:
        return
    d = {k: after[k] - before[k] for k in after}
    steps = max(d["step_seconds_count"], 1)
    row = {"client": client, "round": r + 1, "steps": int(d["step_seconds_count"]),
           "server_step_ms": d["step_seconds_sum"] / steps * 1e3,
           "server_forward_ms": d["model_forward_seconds_sum"] / steps * 1e3}
    with open(opts["--server-runs"], "a") as f:
        f.write(json.dumps(row) + "\n")


def sglang_run():
    sys.argv = ["sglang.benchmark.serving"] + argv
    serving.cli_main()


def other_run():
    if other is not None:
        subprocess.run(other, shell=True, check=True)


for r in range(rounds):
    runs = [("sglang", sglang_run), ("other", other_run)]
    for client, run in runs if r % 2 == 0 else runs[::-1]:
        if client == "other" and other is None:
            continue
        measured(client, r, run)
    if other is not None:
        print(f"round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
