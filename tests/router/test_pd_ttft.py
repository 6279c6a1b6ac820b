"""What prefill-decode disaggregation adds to the time to first token: an 8K-token prompt through router +
prefill + decode against the same prompt on one `both` server, medians of alternating runs, on the GPU
(TERN_DEVICE=cuda, TERN_PD_BACKEND=cuda-ipc: scripts/gpu-check --server); on the CPU the prompt's prefill takes
seconds and the test is skipped (the CPU PD tests check outputs).

The servers run the tiny embedded model, whose 8K prefill takes ~40 ms, so what PD adds (a transfer, an import, one
more HTTP hop: a few milliseconds that do not grow with the model's depth) is judged in milliseconds against what it
would add to V4-Flash: at most 5% (issue #7) of a full-depth 8K prefill, measured first in the same run by `tern
bench-step --config full` (or given as TERN_PD_FULL_PREFILL_S seconds). Issue #15: the tiny-model share alone failed
a 5% bound with +5.0 ms on a 42 ms prefill, which says nothing of the model users run. The decode side's phases are
printed."""
import json
import os
import random
import statistics
import subprocess
import tempfile
import time

import pytest

from cluster import TERN_BIN, SseStream, metric, pd_processes

PROMPT_TOKENS = 8192
RUNS = 5

pytestmark = pytest.mark.skipif(os.environ.get("TERN_DEVICE") != "cuda", reason="a GPU measurement (TERN_DEVICE=cuda)")


@pytest.fixture(scope="module")
def full_prefill_seconds():
    """Seconds of one 8K prefill of the full-depth synthetic V4-Flash on this GPU (before the cluster starts: the
    model needs most of the card's memory, the tiny servers' state pools the rest)."""
    given = os.environ.get("TERN_PD_FULL_PREFILL_S")
    if given:
        return float(given)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench-step.json")
        r = subprocess.run([TERN_BIN, "bench-step", "--device", "cuda", "--config", "full", "--batches", "1",
                            "--contexts", "64", "--prefill", str(PROMPT_TOKENS), "--steps", "2", "--warmup", "1",
                            "--json", out], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        rows = [row for row in json.load(open(out))["prefill"] if row["tokens"] == PROMPT_TOKENS]
        assert rows, r.stdout[-2000:]
        return rows[0]["seconds"]


@pytest.fixture(scope="module")
def cluster8k():
    with pd_processes("--max-model-len", str(PROMPT_TOKENS + 64), "--max-chunk", "2048", "--token-budget", "8192") as procs:
        yield procs


def ttft(url, prompt):
    """Seconds from sending the request to the first streamed token, and the streamed text."""
    t0 = time.perf_counter()
    s = SseStream(url, "/v1/completions", {"prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": True},
                  wait_head=False)
    s.resp = s.conn.getresponse()
    assert s.resp.status == 200
    first = None
    while s.next_event() is not None:
        if first is None and any(c.get("text") for e in s.events for c in e.get("choices", [])):
            first = time.perf_counter() - t0
    s.conn.close()
    assert s.done and s.error is None and first is not None, s.error
    return first, s.text()


def test_pd_adds_under_5_percent_to_ttft_of_an_8k_prompt(full_prefill_seconds, cluster8k):
    rng = random.Random(8192)
    both, pd = [], []
    phases = ("connect", "handshake", "prefill", "transfer", "import")
    d = cluster8k["decode"].url

    def phase_totals():
        return {ph: (metric(d, "pd_phase_seconds_sum", phase=ph), metric(d, "pd_phase_seconds_count", phase=ph))
                for ph in phases}

    for i in range(RUNS + 1):
        prompt = [rng.randrange(100, 120000) for _ in range(PROMPT_TOKENS)]  # fresh: no cache of any kind helps
        tb, text_b = ttft(cluster8k["both"].url, prompt)
        tp, text_p = ttft(cluster8k["router"].url, prompt)
        assert text_p == text_b  # greedy: the same tokens through PD
        if i > 0:  # the first pair warms up (graphs recorded at startup; allocator pools)
            both.append(tb)
            pd.append(tp)
        else:
            warm = phase_totals()
    b, p = statistics.median(both), statistics.median(pd)
    added = p - b
    state = metric(cluster8k["decode"].url, "pd_transfer_bytes_total") / (RUNS + 1)
    backend = os.environ.get("TERN_PD_BACKEND", "tcp")
    print(f"\n[gpu pd] ttft 8K prompt (tiny model): both {b * 1e3:.1f} ms, router+prefill+decode ({backend}) "
          f"{p * 1e3:.1f} ms, added {added * 1e3:+.1f} ms ({added / b * 100:+.1f}% of the tiny model's); state "
          f"{state / 2**20:.1f} MiB per request")
    print(f"[gpu pd] against a full-depth 8K prefill: {full_prefill_seconds * 1e3:.0f} ms (bench-step --config full), "
          f"PD adds {added / full_prefill_seconds * 100:+.2f}% (bound 5%: {0.05 * full_prefill_seconds * 1e3:.0f} ms)")
    end = phase_totals()  # the measured runs only: the warm-up transfer's phases are subtracted
    means = {ph: (end[ph][0] - warm[ph][0]) / max(1.0, end[ph][1] - warm[ph][1]) for ph in phases}
    print("[gpu pd] decode-side phases, mean ms: " + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in means.items()))
    assert all(end[ph][1] - warm[ph][1] >= RUNS for ph in ("transfer", "import")), (warm, end)  # phases recorded
    # The state of an 8K prompt of the tiny model is small; V4-Flash's is ~53 MiB (bench-step's "state per sequence"),
    # which the CUDA IPC path moves device to device (~0.1 ms at copy rates): the transfer phase is not what scales.
    assert added < 0.05 * full_prefill_seconds, (both, pd, full_prefill_seconds)
