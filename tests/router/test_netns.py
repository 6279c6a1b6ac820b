"""A cut link between a prefill and a decode server (Linux network namespaces): the transfer hits the
heartbeat timeout on both sides, is reported (client error naming it, metrics by reason) and frees the
decode server's reserved memory; when the link is back, requests work again.

Topology (names and subnets unique per test process):
    root ns: the router (127.0.0.1) and this test  --veth--  ns P: prefill (HTTP on the root link)
                                                   --veth--  ns D: decode  (HTTP on the root link)
    ns P <--veth (the transfer link)--> ns D: bootstrap, control and data connections
Needs root and `ip netns` (iproute2, scripts/setup-deps); elsewhere the whole file exits 77 with the
reason, which CTest reports as skipped."""
import os
import random
import shutil
import subprocess
import threading
import time

import pytest

from cluster import metric, post, route, serve, wait_for

PEER_TIMEOUT = 2.0
HEARTBEAT = 0.5


def sh(*cmd):
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def netns_unavailable():
    if os.geteuid() != 0:
        return "the cut-link test needs root (network namespaces)"
    if not shutil.which("ip"):
        return "the cut-link test needs `ip` (iproute2; scripts/setup-deps installs it)"
    probe = f"tnp{os.getpid() % 100000}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns add` failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


_why = netns_unavailable()
if _why:
    pytest.exit("SKIPPED: " + _why, returncode=77)


class Net:
    def __init__(self):
        tag = os.getpid() % 100000
        self.ns_p, self.ns_d = f"tnP{tag}", f"tnD{tag}"
        b = 3 * (os.getpid() % 80)
        self.p_root, self.p_http = f"10.231.{b}.1", f"10.231.{b}.2"
        self.d_root, self.d_http = f"10.231.{b + 1}.1", f"10.231.{b + 1}.2"
        self.p_link, self.d_link = f"10.231.{b + 2}.1", f"10.231.{b + 2}.2"
        self.dev_pd, self.dev_dp = f"tn{tag}pd", f"tn{tag}dp"
        sh("ip", "netns", "add", self.ns_p)
        sh("ip", "netns", "add", self.ns_d)
        self.veth(f"tn{tag}rp", None, self.p_root, f"tn{tag}pr", self.ns_p, self.p_http)
        self.veth(f"tn{tag}rd", None, self.d_root, f"tn{tag}dr", self.ns_d, self.d_http)
        self.veth(self.dev_pd, self.ns_p, self.p_link, self.dev_dp, self.ns_d, self.d_link)
        for ns in (self.ns_p, self.ns_d):
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    @staticmethod
    def veth(a, ns_a, ip_a, b, ns_b, ip_b):
        sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        for dev, ns, ip in ((a, ns_a, ip_a), (b, ns_b, ip_b)):
            if ns:
                sh("ip", "link", "set", dev, "netns", ns)
            pre = ["ip", "-n", ns] if ns else ["ip"]
            sh(*pre, "addr", "add", ip + "/24", "dev", dev)
            sh(*pre, "link", "set", dev, "up")

    def cut(self, up=False):
        sh("ip", "-n", self.ns_d, "link", "set", self.dev_dp, "up" if up else "down")
        if up:
            sh("ip", "-n", self.ns_p, "link", "set", self.dev_pd, "up")

    def close(self):
        for ns in (self.ns_p, self.ns_d):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture(scope="module")
def net_cluster():
    net = Net()
    procs = {}
    try:
        timeouts = ["--pd-heartbeat", str(HEARTBEAT), "--pd-peer-timeout", str(PEER_TIMEOUT)]
        procs["p"] = serve("prefill", "--host", net.p_http, "--pd-host", net.p_link, *timeouts, wait=False,
                           wrap=("ip", "netns", "exec", net.ns_p))
        procs["d"] = serve("decode", "--host", net.d_http, "--pd-host", net.d_link, *timeouts, wait=False,
                           wrap=("ip", "netns", "exec", net.ns_d))
        procs["p"].wait_ready()
        procs["d"].wait_ready()
        procs["router"] = route("--prefill", procs["p"].url, "--decode", procs["d"].url, "--retries", "0")
        yield net, procs
    finally:
        for p in procs.values():
            p.stop()
        net.close()


def long_prompt(seed, n=1500):
    rng = random.Random(seed)
    return [rng.randrange(100, 120000) for _ in range(n)]


def test_across_namespaces(net_cluster):
    net, procs = net_cluster
    assert net.p_link in procs["p"].log()  # the bootstrap is on the P-D link
    status, j = post(procs["router"].url, "/v1/completions", {"prompt": "hello there", "max_tokens": 4, "temperature": 0})
    assert status == 200 and j["usage"]["completion_tokens"] == 4, j
    assert metric(procs["d"].url, "pd_transfers_total") == 1


def test_cut_link_times_out_and_is_reported(net_cluster):
    net, procs = net_cluster
    r, p, d = procs["router"], procs["p"], procs["d"]
    results = {}

    def ask(i):
        results[i] = post(r.url, "/v1/completions", {"prompt": long_prompt(i), "max_tokens": 4, "temperature": 0})

    clients = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for c in clients:
        c.start()
    assert wait_for(lambda: metric(d.url, "num_requests_transferring") >= 1, timeout=60, interval=0.02)
    net.cut()
    cut_at = time.time()
    try:
        for c in clients:
            c.join(60)
        elapsed = time.time() - cut_at
        messages = [j["error"]["message"] for _, j in results.values()]
        for status, j in results.values():
            # A transfer in flight at the cut times out on its heartbeat; the other request's transfer may start
            # after the cut and then cannot connect (seen in CI, 2026-12-04): both are the cut, reported as a 502.
            m = j["error"]["message"]
            assert status == 502 and ("no heartbeat" in m or "Network is unreachable" in m), (status, j)
        assert any("no heartbeat" in m for m in messages), messages
        # The peer timeout counts from the last byte the peer received, which can come up to one heartbeat before
        # the cut (CI, 2026-12-05: 1.798 s after the cut with a 2 s timeout and 0.5 s heartbeats).
        assert PEER_TIMEOUT - HEARTBEAT - 0.1 < elapsed < PEER_TIMEOUT + 4, elapsed
        print(f"[measured] link cut: clients got the timeout error {elapsed:.3f} s later (peer timeout {PEER_TIMEOUT} s)")
        assert metric(d.url, "pd_transfers_failed_total", reason="peer_timeout") >= 1
        assert wait_for(lambda: metric(p.url, "pd_transfers_failed_total", reason="peer_timeout") >= 1, timeout=5)
        assert wait_for(lambda: metric(d.url, "state_memory_used_bytes") == 0, timeout=5)
        assert metric(d.url, "num_requests_transferring") == 0 and metric(d.url, "pd_transfers_in_progress") == 0
        assert wait_for(lambda: metric(p.url, "state_memory_used_bytes") == 0 and
                        metric(p.url, "pd_transfers_in_progress") == 0, timeout=10)
    finally:
        net.cut(up=True)
    # The link is back: transfers work again.
    status, j = post(r.url, "/v1/completions", {"prompt": "back again", "max_tokens": 3})
    assert status == 200, j
