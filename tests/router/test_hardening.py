"""Issue #16 on `tern route`: no request crashes the router, the protocol rules and OpenAI values hold as on
`tern serve`, and a server that comes back after its circuit opened takes all the requests again."""
import concurrent.futures
import json
import os
import sys
import time
import urllib.request

import pytest

from cluster import metric, post, route, serve, wait_for

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from hardening_clients import closed_within, connect, exchange, nested, status_of  # noqa: E402

KEY = "router-key"


@pytest.fixture(scope="module")
def plain_processes():
    s = serve("both")
    procs = {"server": s, "router": route("--server", s.url, "--api-key", KEY, "--header-timeout", "2")}
    yield procs
    procs["router"].stop()
    s.stop()


@pytest.fixture
def plain(plain_processes):
    """A server behind a router with an API key; the router is started again when a test crashed it, so
    that each test is judged alone."""
    if plain_processes["router"].proc.poll() is not None:
        plain_processes["router"] = route("--server", plain_processes["server"].url, "--api-key", KEY,
                                          "--header-timeout", "2")
    return plain_processes


def post_raw(port, path, body, headers):
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    reply = exchange(port, (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            f"Content-Length: {len(body)}\r\nConnection: close\r\n{head}\r\n").encode() + body, timeout=60)
    codes = status_of(reply)
    return (codes[0] if codes else None), reply.split(b"\r\n\r\n", 1)[-1]


def test_nested_json_does_not_crash_the_router(plain):
    r = plain["router"]
    for body in ['{"messages": ' + nested(100000) + ', "max_tokens": 2}',
                 '{"prompt": ' + nested(100000) + "}",
                 '{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": '
                 '{"name": "f", "parameters": ' + nested(50000) + "}}]}"]:
        status, payload = post_raw(r.port, "/v1/chat/completions" if "messages" in body else "/v1/completions",
                                   body.encode(), {"Authorization": f"Bearer {KEY}"})
        assert status == 400, (status, payload[:300], r.log()[-1500:])
        assert "nested deeper than" in json.loads(payload)["error"]["message"]
    assert r.proc.poll() is None
    assert post(r.url, "/v1/completions", {"prompt": "hi", "max_tokens": 2},
                {"Authorization": f"Bearer {KEY}"})[0] == 200


def test_bearer_scheme_is_case_insensitive(plain):
    r = plain["router"]
    for scheme in ["Bearer", "bearer", "BEARER"]:
        assert post(r.url, "/tokenize", {"prompt": "hi"}, {"Authorization": f"{scheme} {KEY}"})[0] == 200, scheme
    assert post(r.url, "/tokenize", {"prompt": "hi"}, {"Authorization": f"Token {KEY}"})[0] == 401


def test_api_key_is_checked_before_the_body_is_read(plain):
    s = connect(plain["router"].port)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 8000000\r\n\r\n")
    s.settimeout(5)
    assert status_of(s.recv(4096)) == [401]
    assert closed_within(s, 5)
    s.close()


def test_protocol_rules(plain):
    r = plain["router"]
    smuggled = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n\r\n"
    reply = exchange(r.port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nAuthorization: Bearer " +
                     KEY.encode() + b"\r\n\r\n" + smuggled, timeout=5)
    assert status_of(reply) == [400], reply[:300]
    reply = exchange(r.port, f"GET http://127.0.0.1:{r.port}/v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}"
                             f"\r\nConnection: close\r\n\r\n".encode())
    assert status_of(reply) == [200], reply[:300]
    s = connect(r.port)  # sends nothing: closed after --header-timeout (2 s), not the 60 s idle timeout
    start = time.time()
    assert closed_within(s, 8) and time.time() - start < 4
    s.close()


def test_a_server_back_from_an_open_circuit_takes_every_concurrent_request():
    """The probe: after a killed server came back, its half-open circuit let one of 20 concurrent requests
    through and rejected the other 19 with 503, while /health said 200 and server_up was 1."""
    s = serve("both")
    r = route("--server", s.url, "--breaker-failures", "1", "--breaker-cooldown", "1")
    try:
        from cluster import SseStream
        stream = SseStream(r.url, "/v1/completions", {"prompt": "a long story", "max_tokens": 500, "ignore_eos": True})
        assert stream.status == 200 and stream.next_event() is not None
        s.kill9()
        stream.read_all()
        assert stream.error
        assert metric(r.url, "router_server_circuit_open") == 1
        s = serve("both", port=s.port)
        assert wait_for(lambda: metric(r.url, "router_server_up") == 1, timeout=30)
        assert urllib.request.urlopen(r.url + "/health", timeout=10).status == 200

        def one(i):
            return post(r.url, "/v1/completions", {"prompt": f"hello {i}", "max_tokens": 4})[0]

        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            statuses = list(pool.map(one, range(20)))
        assert statuses == [200] * 20, statuses
        assert metric(r.url, "router_server_circuit_open") == 0
    finally:
        r.stop()
        s.stop()


def test_servers_count_tokens_per_client_behind_the_router():
    """The router appends the client's address to X-Forwarded-For; a server that trusts the router
    (--forwarded-allow-ips) bounds each client's tokens in flight (--max-client-tokens) on its own, so one
    client's streams cannot use up another's share."""
    s = serve("both", "--forwarded-allow-ips", "127.0.0.1", "--max-client-tokens", "3000", "--max-model-len", "1024")
    r = route("--server", s.url, "--retries", "0")
    try:
        from cluster import SseStream
        body = {"prompt": "hi", "max_tokens": 1000, "ignore_eos": True}
        held = [SseStream(r.url, "/v1/completions", body, source="127.0.0.2") for _ in range(2)]
        assert all(h.status == 200 for h in held)
        status, err = post(r.url, "/v1/completions", {**body, "max_tokens": 1010}, source="127.0.0.2")
        assert status == 429 and "--max-client-tokens" in err["error"]["message"], err
        status, _ = post(r.url, "/v1/completions", {"prompt": "hi", "max_tokens": 2}, source="127.0.0.3")
        assert status == 200
        for h in held:
            h.conn.close()
    finally:
        r.stop()
        s.stop()
