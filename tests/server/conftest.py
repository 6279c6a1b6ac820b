"""Fixtures for the server tests: real `tern serve` processes on loopback (the embedded tiny model).

TERN_BIN names the tern executable (CTest sets it); TERN_DEVICE=cuda runs every server (and `tern run`)
on the GPU (scripts/gpu-check does). Each server picks a free port (--port 0) and is ready when it logs its
"ready: ... at http://127.0.0.1:PORT" line.
"""
import os
import re
import signal
import subprocess
import threading
import time

import pytest

TERN_BIN = os.environ.get("TERN_BIN", "build/tools/tern")
DEVICE_ARGS = ["--device", os.environ["TERN_DEVICE"]] if os.environ.get("TERN_DEVICE") else []
READY = re.compile(r"ready: serving (\S+) at (http://[^\s]+)")


class Server:
    def __init__(self, *args, env=None, wait=True, timeout=600):
        self.args = [TERN_BIN, "serve", "--port", "0", *DEVICE_ARGS, *args]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(env or {})})
        self.lines = []
        self.url = None
        self.model = None
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if wait:
            self.wait_ready(timeout)

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            m = READY.search(line)
            if m:
                self.model, self.url = m.group(1), m.group(2)
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout=600):
        self._ready.wait(timeout)
        assert self.url, "server did not become ready:\n" + self.log()

    def log(self):
        return "".join(self.lines)

    @property
    def port(self):
        return int(self.url.rsplit(":", 1)[1])

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="session")
def server():
    s = Server("--header-timeout", "2", "--max-model-len", "2048")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server):
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)


def metric(server, name):
    """The value of tern:<name> (summed over label sets) from /metrics."""
    import urllib.request
    text = urllib.request.urlopen(server.url + "/metrics", timeout=30).read().decode()
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
