"""Fixtures for the server tests: real `tern serve` processes on loopback (the embedded tiny model).

TERN_BIN names the tern executable (CTest sets it); TERN_DEVICE=cuda runs every server (and `tern run`)
on the GPU (scripts/gpu-check does); TERN_SAMPLING=device|host adds `--sampling` to every `tern serve`. Each server picks a free port (--port 0) and is ready when it logs its
"ready: ... at http://127.0.0.1:PORT" line.
"""
import os
import re
import time

import pytest

from tern_process import TernProcess

TERN_BIN = os.environ.get("TERN_BIN", "build/tools/tern")
DEVICE_ARGS = ["--device", os.environ["TERN_DEVICE"]] if os.environ.get("TERN_DEVICE") else []
SERVE_ARGS = DEVICE_ARGS + (["--sampling", os.environ["TERN_SAMPLING"]] if os.environ.get("TERN_SAMPLING") else [])
READY = re.compile(r"ready: serving (\S+) at (http://[^\s]+)")


class Server(TernProcess):
    def __init__(self, *args, env=None, wait=True, timeout=600, preexec=None):
        super().__init__([TERN_BIN, "serve", "--port", "0", *SERVE_ARGS, *args], READY,
                         env={**os.environ, **(env or {})}, wait=wait, timeout=timeout, preexec=preexec)


@pytest.fixture(scope="session")
def server():
    s = Server("--header-timeout", "2", "--max-model-len", "2048")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server):
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)


def metrics_text(server):
    import urllib.request
    return urllib.request.urlopen(server.url + "/metrics", timeout=30).read().decode()


def metric(server, name, text=None):
    """The value of tern:<name> (summed over label sets) from /metrics (or from `text`, one snapshot)."""
    if text is None:
        text = metrics_text(server)
    total = 0.0
    for line in text.splitlines():
        if line.startswith("tern:" + name + "{") or line.startswith("tern:" + name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for(predicate, timeout=30, interval=0.05):
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
