"""Process lifecycle: a taken port, SIGTERM drain, API keys, readiness."""
import json
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from conftest import TERN_BIN, Server


def test_port_in_use_exits_quickly_saying_so():
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    port = blocker.getsockname()[1]
    try:
        start = time.time()
        r = subprocess.run([TERN_BIN, "serve", "--port", str(port)], capture_output=True, text=True, timeout=30)
        elapsed = time.time() - start
    finally:
        blocker.close()
    assert r.returncode != 0
    assert elapsed < 1.0, elapsed
    assert "in use" in r.stderr + r.stdout


def test_api_key():
    s = Server("--api-key", "sekrit-key-123")
    try:
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="sekrit-key-123", max_retries=0)
        assert good.completions.create(model=s.model, prompt="a", max_tokens=2).usage.completion_tokens == 2
        for key in ["wrong", "sekrit-key-12", "sekrit-key-1234", ""]:
            bad = openai.OpenAI(base_url=s.url + "/v1", api_key=key or "x", max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                bad.models.list()
        # No header at all; /health and /metrics stay open for probes.
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(s.url + "/v1/models")
        assert e.value.code == 401 and json.loads(e.value.read())["error"]["code"] == "invalid_api_key"
        assert urllib.request.urlopen(s.url + "/health").status == 200
    finally:
        assert s.stop() == 0


def test_health_only_when_ready_and_sigterm_drains():
    s = Server("--drain-timeout", "20", wait=False)
    # Before the ready line, /health is never 200 (503 while loading, or not yet listening).
    while not s._ready.is_set():
        try:
            code = urllib.request.urlopen(f"http://127.0.0.1:{_port_from_log(s)}/health", timeout=5).status
            # The server logs "ready" before /health turns 200; allow only the pipe-reading lag of this test.
            assert code != 200 or s._ready.wait(2.0)
        except (urllib.error.HTTPError, urllib.error.URLError, ValueError, ConnectionError):
            pass
        time.sleep(0.05)
    s.wait_ready()
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=120)
    results = []

    def stream():
        chunks = list(client.completions.create(model=s.model, prompt=[5, 6, 7], max_tokens=12, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        results.append(chunks[-1].usage.completion_tokens)

    threads = [threading.Thread(target=stream) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # in flight
    s.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert s.proc.wait(60) == 0
    assert results == [12, 12, 12, 12]  # in-flight requests finished
    assert "drained" in s.log()


def test_sigterm_aborts_after_the_drain_bound():
    s = Server("--drain-timeout", "1")
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=120)
    errors = []

    def stream():
        try:
            for _ in client.completions.create(model=s.model, prompt=[5, 6, 7], max_tokens=5000, stream=True):
                pass
        except Exception as e:  # the stream ends early: that is the point
            errors.append(e)

    t = threading.Thread(target=stream)
    t.start()
    time.sleep(1.0)
    start = time.time()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(30) == 0
    assert time.time() - start < 10
    t.join(30)
    assert "drain timeout" in s.log()


def _port_from_log(s):
    for line in s.lines:
        if "listening on" in line:
            return int(line.split("listening on ")[1].split(";")[0].rsplit(":", 1)[1])
    raise ValueError("not listening yet")


def test_request_timeout():
    s = Server("--request-timeout", "1")
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=120)
        start = time.time()
        with pytest.raises(openai.APIStatusError) as e:
            client.completions.create(model=s.model, prompt=[5, 6, 7], max_tokens=1000, extra_body={"ignore_eos": True})
        assert e.value.status_code == 504 and time.time() - start < 30
        assert client.completions.create(model=s.model, prompt="a", max_tokens=1).usage.completion_tokens == 1
    finally:
        assert s.stop() == 0
