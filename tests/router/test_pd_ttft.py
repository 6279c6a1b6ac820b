"""What prefill-decode disaggregation adds to the time to first token: an 8K-token prompt through router +
prefill + decode against the same prompt on one `both` server, medians of alternating runs. Issue #7
asks for under 5% on the GPU (TERN_DEVICE=cuda, TERN_PD_BACKEND=cuda-ipc: scripts/gpu-check --server);
on the CPU the prompt's prefill takes seconds and the test is skipped (the CPU PD tests check outputs)."""
import os
import random
import statistics
import time

import pytest

from cluster import SseStream, metric, pd_processes

PROMPT_TOKENS = 8192
RUNS = 5

pytestmark = pytest.mark.skipif(os.environ.get("TERN_DEVICE") != "cuda", reason="a GPU measurement (TERN_DEVICE=cuda)")


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


def test_pd_adds_under_5_percent_to_ttft_of_an_8k_prompt(cluster8k):
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
    state = metric(cluster8k["decode"].url, "pd_transfer_bytes_total") / (RUNS + 1)
    backend = os.environ.get("TERN_PD_BACKEND", "tcp")
    print(f"\n[gpu pd] ttft 8K prompt: both {b * 1e3:.1f} ms, router+prefill+decode ({backend}) {p * 1e3:.1f} ms, "
          f"added {(p - b) / b * 100:+.1f}%; state {state / 2**20:.1f} MiB per request")
    end = phase_totals()  # the measured runs only: the warm-up transfer's phases are subtracted
    means = {ph: (end[ph][0] - warm[ph][0]) / max(1.0, end[ph][1] - warm[ph][1]) for ph in phases}
    print("[gpu pd] decode-side phases, mean ms: " + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in means.items()))
    assert (p - b) / b < 0.05, (both, pd)
