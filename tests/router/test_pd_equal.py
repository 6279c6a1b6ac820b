"""Outputs through router + prefill + decode equal those of one `both` server, token for token and
logprob for logprob: greedy, seeded sampling with penalties and stop strings, n > 1, chat, streaming and
not, for prompts from 1 token to many compression windows (the tiny model: sliding window 16,
compression ratios 4 (with the indexer) and 8), so every kind of state crosses the wire: window rings,
compressor and indexer accumulators part full and full, compressed rows and indexer keys."""
import os
import random

import pytest

from cluster import SseStream, metric, post

LENGTHS = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 129, 300, 700]


def prompt(n, salt):
    rng = random.Random(n * 1000 + salt)
    return [rng.randrange(100, 120000) for _ in range(n)]


def completion(url, body):
    status, j = post(url, "/v1/completions", body)
    assert status == 200, j
    return [(c["text"], c["logprobs"], c["finish_reason"]) for c in j["choices"]], j["usage"]


def streamed(url, path, body):
    s = SseStream(url, path, {**body, "stream_options": {"include_usage": True}}).read_all()
    assert s.status == 200 and s.error is None and s.done, (s.status, s.error)
    out = {}
    usage = None
    for e in s.events:
        if e.get("usage"):
            usage = e["usage"]
        for c in e["choices"]:
            o = out.setdefault(c["index"], {"text": "", "tokens": [], "logprobs": [], "finish": None})
            o["text"] += c.get("text") or (c.get("delta") or {}).get("content") or ""
            if c.get("logprobs"):
                o["tokens"] += c["logprobs"]["tokens"]
                o["logprobs"] += c["logprobs"]["token_logprobs"]
            o["finish"] = c.get("finish_reason") or o["finish"]
    return out, usage


@pytest.mark.parametrize("n", LENGTHS)
def test_greedy_completion_equal(pd_cluster, n):
    body = {"prompt": prompt(n, 1), "max_tokens": 8, "temperature": 0, "logprobs": 2, "ignore_eos": True}
    want = completion(pd_cluster["both"].url, body)
    got = completion(pd_cluster["router"].url, body)
    assert got == want


@pytest.mark.parametrize("n", [1, 4, 17, 64, 300])
def test_greedy_stream_equal(pd_cluster, n):
    body = {"prompt": prompt(n, 2), "max_tokens": 10, "temperature": 0, "logprobs": 1, "ignore_eos": True}
    want = streamed(pd_cluster["both"].url, "/v1/completions", body)
    got = streamed(pd_cluster["router"].url, "/v1/completions", body)
    assert got == want
    assert len(got[0][0]["tokens"]) == 10


def test_first_token_only(pd_cluster):
    """max_tokens 1: the prefill server's token is the whole answer; the decode server delivers it
    without running its model once (the prompt's state came over the wire, it is not recomputed)."""
    body = {"prompt": prompt(40, 3), "max_tokens": 1, "temperature": 0, "logprobs": 3}
    want = completion(pd_cluster["both"].url, body)
    steps = metric(pd_cluster["decode"].url, "engine_steps_total")
    assert completion(pd_cluster["router"].url, body) == want
    assert metric(pd_cluster["decode"].url, "engine_steps_total") == steps
    # With two tokens, one decode step: the second token.
    body["max_tokens"] = 2
    assert completion(pd_cluster["router"].url, body) == completion(pd_cluster["both"].url, body)
    assert metric(pd_cluster["decode"].url, "engine_steps_total") == steps + 1


def test_seeded_sampling_penalties_stop_and_n(pd_cluster):
    """The sampler's random state, penalty counts and stop-string matching continue across the transfer."""
    base = {"max_tokens": 24, "temperature": 0.9, "top_p": 0.95, "top_k": 50, "seed": 1234, "n": 3, "logprobs": 2,
            "presence_penalty": 0.5, "frequency_penalty": 0.3, "repetition_penalty": 1.2}
    for n in [1, 9, 40]:
        body = {**base, "prompt": prompt(n, 4)}
        want = completion(pd_cluster["both"].url, body)
        assert completion(pd_cluster["router"].url, body) == want
        # Stop at a piece of the middle of the first choice's text.
        text = want[0][0][0]
        if len(text) > 6:
            body["stop"] = [text[len(text) // 2: len(text) // 2 + 2]]
            want_stop = completion(pd_cluster["both"].url, body)
            assert want_stop[0][0][2] == "stop"
            assert completion(pd_cluster["router"].url, body) == want_stop


def test_several_prompts_one_request(pd_cluster):
    body = {"prompt": [prompt(5, 5), prompt(20, 6), prompt(70, 7)], "max_tokens": 6, "temperature": 0}
    assert completion(pd_cluster["router"].url, body) == completion(pd_cluster["both"].url, body)


def test_chat_equal_streaming_and_not(pd_cluster):
    body = {"messages": [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": "Name three rivers of Europe, and say why they matter. " * 6}],
            "max_tokens": 12, "temperature": 0}
    status, want = post(pd_cluster["both"].url, "/v1/chat/completions", body)
    status2, got = post(pd_cluster["router"].url, "/v1/chat/completions", body)
    assert status == status2 == 200
    assert got["choices"] == want["choices"] and got["usage"] == want["usage"]
    assert streamed(pd_cluster["router"].url, "/v1/chat/completions", body) == \
        streamed(pd_cluster["both"].url, "/v1/chat/completions", body)


def test_transfers_all_succeeded_and_memory_is_free(pd_cluster):
    d, p = pd_cluster["decode"].url, pd_cluster["prefill"].url
    ok = metric(d, "pd_transfers_total")
    assert ok >= len(LENGTHS) and metric(p, "pd_transfers_total") == ok
    assert metric(d, "pd_transfers_failed_total") == 0 and metric(p, "pd_transfers_failed_total") == 0
    assert metric(d, "pd_transfer_bytes_total") > 0
    assert metric(d, "state_memory_used_bytes") == 0 and metric(p, "state_memory_used_bytes") == 0
    assert metric(d, "pd_landing_bytes") == 0 and metric(d, "num_requests_transferring") == 0
    assert metric(p, "request_success_total", finished_reason="handover") == ok
    # Every completed transfer has its phases timed on the decode side, in order, adding up to something.
    for phase in ("connect", "handshake", "prefill", "transfer", "import"):
        assert metric(d, "pd_phase_seconds_count", phase=phase) == ok, phase
        assert metric(p, "pd_phase_seconds_count", phase=phase) == 0, phase
    assert metric(d, "pd_phase_seconds_sum", phase="prefill") > 0


def test_state_grows_with_the_prompt(pd_cluster):
    """More positions, more row pages (compressed rows and indexer keys) on the wire: whole pages of 64
    tokens cross, so the lengths are pages apart."""
    d = pd_cluster["decode"].url
    sizes = []
    for n in [8, 200, 512]:
        before = metric(d, "pd_transfer_bytes_total")
        completion(pd_cluster["router"].url, {"prompt": prompt(n, 8), "max_tokens": 1, "temperature": 0})
        sizes.append(metric(d, "pd_transfer_bytes_total") - before)
    assert sizes[0] < sizes[1] < sizes[2], sizes


def test_roles_refuse_what_is_not_theirs(pd_cluster):
    body = {"prompt": "hello", "max_tokens": 2}
    for role in ["prefill", "decode"]:
        status, j = post(pd_cluster[role].url, "/v1/completions", body)
        assert status == 400 and "tern route" in j["error"]["message"], j
    status, j = post(pd_cluster["both"].url, "/v1/completions", body, {"X-Tern-Room": "00ff"})
    assert status == 400 and "--role both" in j["error"]["message"]
    status, j = post(pd_cluster["decode"].url, "/v1/completions", body, {"X-Tern-Room": "zz", "X-Tern-Bootstrap": "1.2.3.4:5"})
    assert status == 400 and "X-Tern-Room" in j["error"]["message"]
    status, j = post(pd_cluster["decode"].url, "/v1/completions", body, {"X-Tern-Room": "0abc"})
    assert status == 400 and "X-Tern-Bootstrap" in j["error"]["message"]
    assert metric(pd_cluster["decode"].url, "state_memory_used_bytes") == 0


def test_client_disconnect_mid_stream_aborts_decode(pd_cluster):
    """Mid-stream: the decode request ends, no memory is left."""
    from cluster import SseStream, wait_for
    r, d = pd_cluster["router"].url, pd_cluster["decode"].url
    gone = metric(d, "client_disconnects_total")
    s = SseStream(r, "/v1/completions", {"prompt": prompt(30, 9), "max_tokens": 500, "ignore_eos": True})
    assert s.next_event() is not None
    s.conn.close()
    assert wait_for(lambda: metric(d, "client_disconnects_total") == gone + 1, timeout=5)
    assert wait_for(lambda: metric(d, "state_memory_used_bytes") == 0 and metric(d, "num_requests_running") == 0,
                    timeout=5)


@pytest.mark.skipif(os.environ.get("TERN_DEVICE") == "cuda",
                    reason="the GPU runs the 1500-token prompt in milliseconds: no poll of /metrics sees it running")
def test_client_disconnect_before_the_first_token_aborts_both_sides(pd_cluster):
    """Mid-prefill: the prefill room and the decode request end, no memory is left on either side."""
    from cluster import SseStream, wait_for
    r, p, d = pd_cluster["router"].url, pd_cluster["prefill"].url, pd_cluster["decode"].url
    # The prefill server is still running the prompt when the client leaves.
    # Either side may notice first: the prefill room ends "aborted" (its router connection closed) or
    # "peer_error" (the decode side, aborted by its own closed connection, said so).
    failed = metric(p, "pd_transfers_failed_total")
    s = SseStream(r, "/v1/completions", {"prompt": prompt(1500, 10), "max_tokens": 5}, wait_head=False)
    assert wait_for(lambda: metric(p, "num_requests_running") >= 1, timeout=30, interval=0.02)
    s.conn.close()
    assert wait_for(lambda: metric(p, "pd_transfers_failed_total") == failed + 1, timeout=5)
    assert metric(p, "pd_transfers_failed_total", reason="aborted") + \
        metric(p, "pd_transfers_failed_total", reason="peer_error") >= 1
    for url in (p, d):
        assert wait_for(lambda: metric(url, "state_memory_used_bytes") == 0 and metric(url, "pd_transfers_in_progress") == 0
                        and metric(url, "num_requests_running") == 0, timeout=5), url


def test_tokenize_through_the_pd_router(pd_cluster):
    body = {"prompt": "a few words to count"}
    assert post(pd_cluster["router"].url, "/tokenize", body) == post(pd_cluster["both"].url, "/tokenize", body)
