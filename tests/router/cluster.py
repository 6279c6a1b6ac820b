"""Real `tern serve` (any role) and `tern route` processes on loopback for the router and PD tests.

TERN_BIN names the tern executable, TERN_ROUTE_BIN the router's own (tern-route; without it routers run as
`tern route`); CTest sets both. Every process picks a free port (--port 0) and is
ready when it logs its ready line; `wrap` runs a process inside something else (e.g. `ip netns exec`).
TERN_DEVICE=cuda runs every server on the GPU, TERN_PD_BACKEND picks the prefill and decode servers'
--pd-backend (scripts/gpu-check sets both).
"""
import contextlib
import http.client
import json
import os
import re
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from tern_process import TernProcess  # noqa: E402  (tests/server/tern_process.py)

TERN_BIN = os.environ.get("TERN_BIN", "build/tools/tern")
ROUTE_BIN = os.environ.get("TERN_ROUTE_BIN")


def route_command():
    """The command line that starts a router, before its options."""
    return [ROUTE_BIN] if ROUTE_BIN else [TERN_BIN, "route"]
SERVE_READY = re.compile(r"ready: serving (\S+) at (http://[^\s]+?)( |$)")
ROUTE_READY = re.compile(r"ready: routing (\S+) at (http://[^\s]+?)( |$)")
BOOTSTRAP = re.compile(r"bootstrap (\S+)")


class Proc(TernProcess):
    """A tern process: `command` and `args` (`wrap` runs it inside something else, e.g. `ip netns exec`)."""

    def __init__(self, args, ready, wait=True, timeout=600, wrap=(), command=None):
        super().__init__([*wrap, *(command or [TERN_BIN]), *args], ready, wait=wait, timeout=timeout)


def serve(role="both", *args, port=0, wait=True, wrap=()):
    extra = ["--role", role] if role != "both" else []
    if os.environ.get("TERN_DEVICE"):
        extra += ["--device", os.environ["TERN_DEVICE"]]
    if role != "both" and os.environ.get("TERN_PD_BACKEND"):
        extra += ["--pd-backend", os.environ["TERN_PD_BACKEND"]]
    if "--max-model-len" not in args:
        extra += ["--max-model-len", "2048"]
    return Proc(["serve", "--port", str(port), "--header-timeout", "5", *extra, *args],
                SERVE_READY, wait=wait, wrap=wrap)


def route(*args, wait=True, port=0):
    return Proc(["--port", str(port), "--health-interval", "0.25", "--health-timeout", "1", *args], ROUTE_READY,
                wait=wait, command=route_command())


@contextlib.contextmanager
def pd_processes(*args):
    """One `both` server (the reference), a prefill and a decode server, all with `args`, and a router in PD
    mode in front of the prefill and decode servers; stopped at the end."""
    procs = {role: serve(role, *args, wait=False) for role in ("both", "prefill", "decode")}
    try:
        for p in procs.values():
            p.wait_ready()
        procs["router"] = route("--prefill", procs["prefill"].url, "--decode", procs["decode"].url)
        yield procs
    finally:
        for p in procs.values():
            p.stop()


def metric(url, name, **labels):
    """tern:<name> from url/metrics, summed over the label sets that include `labels`."""
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    total, want = 0.0, [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith("tern:" + name + "{") and all(w in line for w in want):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for(predicate, timeout=30, interval=0.05):
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def connection(url, timeout=300, source=None):
    """An http.client connection to url, from the loopback address `source` (another client) if given."""
    host, port = url[len("http://"):].rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=timeout, source_address=(source, 0) if source else None)


def post(url, path, body, headers=None, timeout=300, source=None):
    """POST JSON (from the loopback address `source` if given); returns (status, parsed JSON or text)."""
    conn = connection(url, timeout, source)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        text = r.read().decode()
    finally:
        conn.close()
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, text


class SseStream:
    """A streaming request read event by event (http.client, so a broken stream is seen as it is)."""

    def __init__(self, url, path, body, timeout=300, wait_head=True, source=None):
        """Sends the request (from the loopback address `source` if given); reads the response head unless
        `wait_head` is False (the router sends it with the first event, after the prompt ran)."""
        self.conn = connection(url, timeout, source)
        self.conn.request("POST", path, json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
        self.resp = self.conn.getresponse() if wait_head else None
        self.status = self.resp.status if self.resp else None
        self.events = []
        self.error = None      # an error event's message
        self.done = False      # [DONE] seen
        self.closed_at = None  # when the stream ended (EOF or [DONE] then EOF)

    def next_event(self):
        """The next event's data, or None at the end of the stream."""
        data = []
        while True:
            line = self.resp.readline()
            if not line:
                self.closed_at = time.time()
                return None
            line = line.decode().rstrip("\r\n")
            if line.startswith("data: "):
                data.append(line[6:])
            elif line == "" and data:
                d = "\n".join(data)
                if d == "[DONE]":
                    self.done = True
                else:
                    j = json.loads(d)
                    if "error" in j:
                        self.error = j["error"]["message"]
                    self.events.append(j)
                return d

    def read_all(self):
        try:
            while self.next_event() is not None:
                pass
        except (ConnectionError, http.client.HTTPException, OSError) as e:
            self.error = self.error or repr(e)
            self.closed_at = time.time()
        self.conn.close()
        return self

    def text(self):
        return "".join(c.get("text", "") or c.get("delta", {}).get("content", "") or ""
                       for e in self.events for c in e.get("choices", []))


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
