"""Shared fixtures of the router and PD tests (processes in cluster.py)."""
import pytest

from cluster import pd_processes


@pytest.fixture(scope="module")
def pd_cluster():
    """One `both` server (the reference), a prefill and a decode server, a router in PD mode."""
    with pd_processes() as procs:
        yield procs
