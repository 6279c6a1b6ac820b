"""`tern route` in plain mode (a pool of `both` servers) and its lifecycle: policies, health checks that
remove and re-add servers, limits, API keys, client disconnects passed on as aborts, a taken port,
readiness, SIGTERM drain, bad flags."""
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import openai
import pytest

from cluster import TERN_BIN, SseStream, metric, post, route, route_command, serve, wait_for

KEY = "upstream-key-1"


@pytest.fixture(scope="module")
def pool():
    servers = [serve("both", "--api-key", KEY, wait=False) for _ in range(2)]
    try:
        for s in servers:
            s.wait_ready()
        yield servers
    finally:
        for s in servers:
            s.stop()


def plain_router(servers, *args):
    urls = [a for s in servers for a in ("--server", s.url)]
    return route(*urls, "--upstream-api-key", KEY, *args)


def served(router, server):
    return metric(router.url, "router_server_requests_total", server=server.url)


def test_round_robin_spreads_and_answers_like_a_server(pool):
    r = plain_router(pool, "--policy", "round-robin")
    try:
        body = {"prompt": "one two three four", "max_tokens": 6, "temperature": 0}
        want = post(pool[0].url, "/v1/completions", body, {"Authorization": f"Bearer {KEY}"})[1]["choices"]
        for _ in range(6):
            status, j = post(r.url, "/v1/completions", body)
            assert status == 200 and j["choices"] == want
        assert served(r, pool[0]) == 3 and served(r, pool[1]) == 3
        client = openai.OpenAI(base_url=r.url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == [pool[0].model]
        text = "".join(c.choices[0].text for c in client.completions.create(model=r.model, prompt="one two three four",
                                                                            max_tokens=6, temperature=0, stream=True))
        assert text == want[0]["text"]
    finally:
        assert r.stop() == 0


def test_least_loaded_avoids_the_busy_server(pool):
    r = plain_router(pool, "--policy", "least-loaded")
    try:
        long = SseStream(r.url, "/v1/completions", {"prompt": "x", "max_tokens": 300, "ignore_eos": True})
        long.next_event()
        busy = pool[0] if served(r, pool[0]) == 1 else pool[1]
        idle = pool[1] if busy is pool[0] else pool[0]
        for _ in range(3):
            assert post(r.url, "/v1/completions", {"prompt": "short", "max_tokens": 2})[0] == 200
        assert served(r, idle) == 3 and served(r, busy) == 1
        long.conn.close()
    finally:
        assert r.stop() == 0


def test_prefix_affinity_keeps_a_prefix_on_one_server(pool):
    r = plain_router(pool, "--policy", "prefix-affinity")
    try:
        homes = set()
        # Rendezvous hashing over the servers' URLs (random ports): 6 prefixes all landed on one server in
        # about 1 run of 32 (2 / 2^6); with 16 it is 1 in 32 768.
        for i in range(16):
            before = [served(r, s) for s in pool]
            for _ in range(3):
                assert post(r.url, "/v1/completions", {"prompt": f"shared prefix number {i} " * 20, "max_tokens": 1})[0] == 200
            delta = [served(r, s) - b for s, b in zip(pool, before)]
            assert sorted(delta) == [0, 3], delta
            homes.add(delta.index(3))
        assert homes == {0, 1}  # different prefixes land on both servers
    finally:
        assert r.stop() == 0


def test_health_checks_remove_and_readd_a_server(pool):
    extra = serve("both", "--api-key", KEY)
    r = plain_router([pool[0], extra], "--policy", "round-robin")
    try:
        port = extra.port
        # Down only after it was up: killed before its first health check, it is never reported "down".
        assert wait_for(lambda: metric(r.url, "router_server_up", server=extra.url) == 1, timeout=10)
        extra.kill9()
        assert wait_for(lambda: metric(r.url, "router_server_healthy", server=extra.url) == 0, timeout=5)
        for _ in range(4):  # every request still answered (a first attempt at the dead server is retried)
            assert post(r.url, "/v1/completions", {"prompt": "a b c", "max_tokens": 2})[0] == 200
        assert wait_for(lambda: "is down" in r.log(), timeout=5), r.log()  # the log line arrives through a pipe
        extra = serve("both", "--api-key", KEY, port=port)
        assert wait_for(lambda: metric(r.url, "router_server_up", server=extra.url) == 1, timeout=10)
        before = served(r, extra)
        for _ in range(4):
            assert post(r.url, "/v1/completions", {"prompt": "a b c", "max_tokens": 2})[0] == 200
        assert served(r, extra) > before
    finally:
        r.stop()
        extra.stop()


def test_limit_answers_429(pool):
    r = plain_router(pool, "--max-requests", "2")
    try:
        streams = [SseStream(r.url, "/v1/completions", {"prompt": "x", "max_tokens": 400, "ignore_eos": True}) for _ in range(2)]
        for s in streams:
            s.next_event()
        status, j = post(r.url, "/v1/completions", {"prompt": "x", "max_tokens": 1})
        assert status == 429 and "--max-requests" in j["error"]["message"]
        assert metric(r.url, "router_requests_total", result="rejected") == 1
        for s in streams:
            s.conn.close()
    finally:
        r.stop()


def test_client_disconnect_aborts_the_server_request(pool):
    r = plain_router(pool[:1])
    try:
        before = metric(pool[0].url, "client_disconnects_total")
        s = SseStream(r.url, "/v1/completions", {"prompt": "x", "max_tokens": 1000, "ignore_eos": True})
        s.next_event()
        s.conn.close()
        assert wait_for(lambda: metric(pool[0].url, "client_disconnects_total") == before + 1, timeout=5)
        assert wait_for(lambda: metric(pool[0].url, "num_requests_running") == 0, timeout=5)
        assert metric(pool[0].url, "state_memory_used_bytes") == 0
        assert wait_for(lambda: metric(r.url, "router_requests_total", result="client_gone") == 1, timeout=5)
    finally:
        r.stop()


def test_api_keys(pool):
    r = route("--server", pool[0].url, "--api-key", "client-key", "--upstream-api-key", KEY)
    try:
        assert post(r.url, "/v1/completions", {"prompt": "a", "max_tokens": 1})[0] == 401
        assert post(r.url, "/v1/completions", {"prompt": "a", "max_tokens": 1}, {"Authorization": "Bearer client-key"})[0] == 200
        assert urllib.request.urlopen(r.url + "/health").status == 200  # probes need no key
    finally:
        r.stop()
    # Without the upstream key the server's 401 is the answer (a client error is not retried).
    r = route("--server", pool[0].url)
    try:
        status, j = post(r.url, "/v1/completions", {"prompt": "a", "max_tokens": 1})
        assert status == 401 and j["error"]["code"] == "invalid_api_key"
        assert metric(r.url, "router_retries_total") == 0
    finally:
        r.stop()


def test_bad_requests_pass_through_unchanged(pool):
    r = plain_router(pool[:1])
    try:
        for body in [{"prompt": "a", "max_tokens": -1}, {"prompt": "a", "bogus": 1}]:
            direct = post(pool[0].url, "/v1/completions", body, {"Authorization": f"Bearer {KEY}"})
            assert post(r.url, "/v1/completions", body) == direct and direct[0] == 400
        assert post(r.url, "/v2/nothing", {})[0] == 404
    finally:
        r.stop()


def test_port_in_use_exits_quickly_saying_so(pool):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    try:
        start = time.time()
        p = subprocess.run([*route_command(), "--port", str(blocker.getsockname()[1]), "--server", pool[0].url],
                           capture_output=True, text=True, timeout=30)
        elapsed = time.time() - start
    finally:
        blocker.close()
    assert p.returncode != 0 and elapsed < 1.0, (p.returncode, elapsed)
    assert "in use" in p.stderr


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_taken_transfer_port_exits_quickly_saying_so(role):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    try:
        start = time.time()
        p = subprocess.run([TERN_BIN, "serve", "--port", "0", "--role", role, "--pd-port", str(blocker.getsockname()[1])],
                           capture_output=True, text=True, timeout=30)
        elapsed = time.time() - start
    finally:
        blocker.close()
    assert p.returncode != 0 and elapsed < 1.0, (p.returncode, elapsed, p.stderr)
    assert "in use" in p.stderr, p.stderr


@pytest.mark.parametrize("args, message", [
    (["--server", "http://127.0.0.1:1", "--prefill", "http://127.0.0.1:2"], "cannot be mixed"),
    (["--prefill", "http://127.0.0.1:2"], "at least one --prefill and one --decode"),
    ([], "no servers"),
    (["--server", "localhost:80"], "http://host:port"),
    (["--server", "http://127.0.0.1:1", "--policy", "random"], "round-robin, least-loaded or prefix-affinity"),
])
def test_bad_flags_exit_with_the_reason(args, message):
    p = subprocess.run([*route_command(), "--port", "0", *args], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and message in p.stderr, p.stderr


def test_not_ready_until_a_server_is_up_then_drains_on_sigterm(pool):
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    free_port = probe.getsockname()[1]
    probe.close()
    r = route("--server", f"http://127.0.0.1:{free_port}", "--upstream-api-key", KEY, "--drain-timeout", "20", wait=False)
    late = None
    try:
        assert wait_for(lambda: r.listen_url is not None, timeout=10)
        time.sleep(1)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(r.listen_url + "/health")
        assert e.value.code == 503 and r.url is None
        status, j = post(r.listen_url, "/v1/completions", {"prompt": "a", "max_tokens": 1})
        assert status == 503
        late = serve("both", "--api-key", KEY, port=free_port)
        r.wait_ready(30)
        assert urllib.request.urlopen(r.url + "/health").status == 200
        # SIGTERM with a stream in flight: the stream finishes, new connections are refused, exit 0.
        s = SseStream(r.url, "/v1/completions", {"prompt": "x", "max_tokens": 40, "ignore_eos": True})
        s.next_event()
        r.proc.send_signal(signal.SIGTERM)
        s.read_all()
        assert s.done and s.error is None and len(s.events) >= 40
        assert r.proc.wait(30) == 0
    finally:
        r.stop()
        if late:
            late.stop()


def test_pd_example_script_runs():
    """scripts/pd-example starts prefill, decode and router, streams one answer, stops them."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    p = subprocess.run([os.path.join(root, "scripts", "pd-example"), "--once", "--port", "0"], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "TERN_BIN": os.path.abspath(TERN_BIN)})
    assert p.returncode == 0, p.stdout + p.stderr
    assert "data: [DONE]" in p.stdout and 'tern:pd_transfers_total{model_name="tern-tiny-v4",side="decode"} 1' in p.stdout
    # It stopped all three: their ports refuse connections (the servers once outlived the script).
    urls = re.search(r"prefill (http://\S+), decode (http://\S+), router (http://\S+) ", p.stdout)
    assert urls, p.stdout
    def refused(host, port):
        with socket.socket() as s:
            return s.connect_ex((host, int(port))) != 0
    for url in urls.groups():
        host, port = url[len("http://"):].rsplit(":", 1)
        assert wait_for(lambda: refused(host, port), timeout=10), url + " still answers"
