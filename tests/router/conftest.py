"""Shared fixtures of the router and PD tests (processes in cluster.py)."""
import pytest

from cluster import pd_processes


@pytest.fixture(scope="module")
def pd_cluster():
    """One `both` server (the reference), a prefill and a decode server, a router in PD mode."""
    # Prefill chunks of 512 (the default is the whole token budget): the fault tests act in the middle of a
    # prefill, so a 1 500-token prompt must span several steps.
    with pd_processes("--max-chunk", "512") as procs:
        yield procs
