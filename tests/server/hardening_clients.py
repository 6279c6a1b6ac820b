"""Clients for the hardening tests (issue #16), shared by tests/server, tests/router and tests/fuzz: raw
sockets for what no polite client sends, the openai SDK bound to a chosen loopback source address (each
127.0.0.x is another client to the server), and the server process's resident memory and CPU time."""
import os
import re
import resource
import socket
import time

from load_test import rss_bytes  # noqa: F401  (one reader of VmRSS for the server tests)

LOCAL = "127.0.0.1"


def raise_file_limit(need):
    """Lets this process (and the servers it starts) hold `need` sockets; False when the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need <= hard or (soft < need and hard == resource.RLIM_INFINITY):
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= need


def connect(port, source=LOCAL, timeout=10):
    return socket.create_connection((LOCAL, port), timeout=timeout, source_address=(source, 0))


def exchange(port, data, timeout=10, source=LOCAL):
    """Sends raw bytes, returns everything read until the server closes (or `timeout` passes)."""
    s = connect(port, source, timeout)
    try:
        s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not chunk:
                break
            out += chunk
        return out
    finally:
        s.close()


def status_of(response):
    """The status codes of the HTTP responses in `response`, in order (a response may follow the body of
    the one before it directly)."""
    return [int(code) for code in re.findall(rb"HTTP/1\.[01] (\d{3}) ", response)]


def closed_within(sock, seconds):
    """True when the server closes `sock` within `seconds` (reading nothing else)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True


def sdk(url, source=LOCAL, api_key="none", timeout=120):
    """The official openai SDK, connecting from `source` (another 127.0.0.x is another client)."""
    import httpx2
    import openai
    http = httpx2.Client(transport=httpx2.HTTPTransport(local_address=source), timeout=timeout)
    return openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=timeout, http_client=http)


def cpu_seconds(pid):
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(fn):
    start = time.time()
    out = fn()
    return out, time.time() - start


def nested(depth, open_="[", close="]", inner=""):
    return open_ * depth + inner + close * depth
