"""CI-sized PD load test (the full 500-stream, 2-minute run is scripts/pd-load-test, label "long"):
concurrent streaming clients through the router, no errors, every token delivered, memory flat, no
transfer failures, no state memory left. The warm-up is long enough for the decode batch (and the
engine's logits workspace, which keeps its high-water mark) to reach its peak before memory is measured."""
import asyncio
import json

from cluster import route, serve
from pd_load_test import check, run


def test_concurrent_streams_through_router_prefill_and_decode():
    p, d = serve("prefill", "--max-model-len", "1024", wait=False), serve("decode", "--max-model-len", "1024", wait=False)
    procs = [p, d]
    try:
        p.wait_ready()
        d.wait_ready()
        r = route("--prefill", p.url, "--decode", d.url)
        procs.append(r)
        pids = {"router": r.proc.pid, "prefill": p.proc.pid, "decode": d.proc.pid}
        result = asyncio.run(run(r.url, r.model, pids, clients=200, duration=30, warmup=30, seed=7,
                                 max_tokens_range=(4, 16)))
        problems = check(result, {"prefill": p.url, "decode": d.url})
        print(json.dumps(result, indent=2))
        assert not problems, problems
        assert result["requests"] >= 200
    finally:
        for proc in reversed(procs):
            assert proc.stop() == 0
