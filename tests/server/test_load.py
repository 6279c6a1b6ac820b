"""CI-sized load test (the full 2-minute run is scripts/serve-load-test): 200 concurrent streaming
clients, no errors, every token delivered, memory flat after warm-up."""
import asyncio
import json

from conftest import Server
from load_test import run


def test_200_streaming_clients():
    s = Server("--max-model-len", "1024")
    try:
        result = asyncio.run(run(s.url, s.model, s.proc.pid, clients=200, duration=30, warmup=20, seed=7,
                                 max_tokens_range=(4, 16)))
    finally:
        assert s.stop() == 0
    print(json.dumps(result, indent=2))
    assert result["errors"] == 0, result["error_examples"]
    assert result["undelivered_tokens"] == 0
    assert result["requests"] >= 200
    assert result["rss_growth"] < 0.05, result
