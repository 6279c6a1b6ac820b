"""Failures in PD mode, each with real processes: a decode server killed mid-stream, a prefill server
killed while decode servers hold memory reserved for its transfers, retries before the first token."""
import json
import random
import threading
import time
import urllib.request

import pytest

from cluster import SseStream, metric, post, route, serve, wait_for


@pytest.fixture(scope="module")
def cluster():
    procs = {name: serve(role, wait=False) for name, role in
             [("p1", "prefill"), ("p2", "prefill"), ("d1", "decode"), ("d2", "decode")]}
    try:
        for p in procs.values():
            p.wait_ready()
        procs["router"] = route("--prefill", procs["p1"].url, "--prefill", procs["p2"].url, "--decode", procs["d1"].url,
                                "--decode", procs["d2"].url, "--decode-policy", "round-robin")
        yield procs
    finally:
        for p in procs.values():
            p.stop()


def restart(procs, name):
    old = procs[name]
    procs[name] = serve("decode" if name.startswith("d") else "prefill", port=old.port)
    ready = time.time()
    assert wait_for(lambda: metric(procs["router"].url, "router_server_up", server=old.url) == 1, timeout=10)
    print(f"[measured] {name} restarted: back in the router's rotation {time.time() - ready:.3f} s after its ready line")


def test_kill_decode_mid_stream(cluster):
    r, d1, d2 = cluster["router"], cluster["d1"], cluster["d2"]
    body = {"prompt": "tell me a long story", "max_tokens": 120, "ignore_eos": True, "temperature": 0}
    streams = [SseStream(r.url, "/v1/completions", body) for _ in range(4)]
    for s in streams:
        assert s.status == 200 and s.next_event() is not None
    on_d1 = metric(r.url, "router_server_in_flight", server=d1.url)
    assert on_d1 == 2 and metric(r.url, "router_server_in_flight", server=d2.url) == 2
    readers = [threading.Thread(target=s.read_all) for s in streams]
    for t in readers:
        t.start()
    killed_at = time.time()
    d1.kill9()
    for t in readers:
        t.join(120)
    failed = [s for s in streams if s.error]
    assert len(failed) == on_d1, [s.error for s in streams]
    for s in failed:  # an error event, [DONE], a closed stream: within 5 s of the kill
        assert "mid-stream" in s.error and s.done, s.error
        assert s.closed_at - killed_at < 5.0, s.closed_at - killed_at
    print(f"[measured] decode killed: its streams closed with an error event after "
          f"{max(s.closed_at for s in failed) - killed_at:.3f} s")
    for s in streams:
        if not s.error:
            assert s.done and len(s.text()) > 0 and s.events[-1]["choices"][0]["finish_reason"] == "length"
    # New requests go elsewhere (a first attempt at the dead server is retried before any byte is sent).
    for _ in range(4):
        status, j = post(r.url, "/v1/completions", {"prompt": "after the crash", "max_tokens": 3})
        assert status == 200, j
    assert wait_for(lambda: metric(r.url, "router_server_healthy", server=d1.url) == 0, timeout=5)
    # The server comes back on its port and rejoins.
    restart(cluster, "d1")
    before = metric(r.url, "router_server_requests_total", server=d1.url)
    for _ in range(4):
        assert post(r.url, "/v1/completions", {"prompt": "after the restart", "max_tokens": 3})[0] == 200
    assert metric(r.url, "router_server_requests_total", server=d1.url) > before
    assert metric(cluster["d1"].url, "pd_transfers_total") > 0


def long_prompt(seed, n=1500):
    rng = random.Random(seed)
    return [rng.randrange(100, 120000) for _ in range(n)]


def prefill_quietly(url, body, room):
    try:
        post(url, "/v1/completions", body, {"X-Tern-Room": room})
    except OSError:  # the prefill server is killed under it
        pass


def test_kill_prefill_mid_transfer_frees_decode_memory(cluster):
    """Acting as the router (rooms by hand) so that only the transfer protocol can free the memory."""
    p1, d2 = cluster["p1"], cluster["d2"]
    bootstrap = json.loads(urllib.request.urlopen(p1.url + "/pd/info").read())["bootstrap"]
    failed_before = metric(d2.url, "pd_transfers_failed_total", reason="peer_closed")
    results = {}

    def send(i):
        body = {"prompt": long_prompt(i), "max_tokens": 4, "temperature": 0}
        room = f"{0xfa000 + i:016x}"
        threading.Thread(target=prefill_quietly, args=(p1.url, body, room), daemon=True).start()
        results[i] = post(d2.url, "/v1/completions", body, {"X-Tern-Room": room, "X-Tern-Bootstrap": bootstrap})

    clients = [threading.Thread(target=send, args=(i,)) for i in range(3)]
    for c in clients:
        c.start()
    # The decode server holds state memory reserved for the transfers while the prefill server computes.
    assert wait_for(lambda: metric(d2.url, "num_requests_transferring") >= 1, timeout=30, interval=0.02)
    assert metric(d2.url, "state_memory_used_bytes") > 0
    p1.kill9()
    killed_at = time.time()
    for c in clients:
        c.join(60)
    for i, (status, j) in results.items():
        assert status == 500 and "state transfer failed" in j["error"]["message"], (i, status, j)
    assert wait_for(lambda: metric(d2.url, "state_memory_used_bytes") == 0, timeout=5, interval=0.01)
    print(f"[measured] prefill killed: decode memory free and requests failed after {time.time() - killed_at:.3f} s")
    assert time.time() - killed_at < 5
    assert metric(d2.url, "num_requests_transferring") == 0 and metric(d2.url, "pd_landing_bytes") == 0
    assert metric(d2.url, "pd_transfers_in_progress") == 0
    assert metric(d2.url, "pd_transfers_failed_total", reason="peer_closed") >= failed_before + 1
    # Through the router, requests keep working (retried on the other prefill server, or routed there).
    for _ in range(4):
        status, j = post(cluster["router"].url, "/v1/completions", {"prompt": "still there?", "max_tokens": 3})
        assert status == 200, j
    restart(cluster, "p1")
    assert metric(d2.url, "state_memory_used_bytes") == 0


def test_router_retries_a_failed_transfer_before_the_first_token(cluster):
    """A prefill server that dies mid-prompt: the router's retry on the other one answers the client."""
    r, p2 = cluster["router"], cluster["p2"]
    retries = metric(r.url, "router_retries_total")
    out = {}

    def ask(i):
        out[i] = post(r.url, "/v1/completions", {"prompt": long_prompt(100 + i, 1200), "max_tokens": 3, "temperature": 0})

    clients = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for c in clients:
        c.start()
    assert wait_for(lambda: metric(p2.url, "num_requests_running") + metric(p2.url, "num_requests_waiting") >= 1,
                    timeout=30, interval=0.02)
    p2.kill9()
    for c in clients:
        c.join(120)
    assert all(status == 200 for status, _ in out.values()), out
    assert metric(r.url, "router_retries_total") > retries
    for d in ("d1", "d2"):
        assert wait_for(lambda: metric(cluster[d].url, "state_memory_used_bytes") == 0, timeout=10)
    restart(cluster, "p2")
