"""Shared fixtures of the router and PD tests (processes in cluster.py)."""
import pytest

from cluster import route, serve


@pytest.fixture(scope="module")
def pd_cluster():
    """One `both` server (the reference), a prefill and a decode server, a router in PD mode."""
    procs = {"both": serve("both", wait=False), "prefill": serve("prefill", wait=False), "decode": serve("decode", wait=False)}
    try:
        for p in procs.values():
            p.wait_ready()
        procs["router"] = route("--prefill", procs["prefill"].url, "--decode", procs["decode"].url)
        yield procs
    finally:
        for p in procs.values():
            p.stop()
