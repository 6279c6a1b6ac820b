"""`tern serve --synthetic`: random weights built in place (no checkpoint) behind the real HTTP server, the
path `tern bench` measures at full depth on the GPU machine (docs/bench-step.md). Here the tiny shape."""
import json
import urllib.request

from conftest import Server


def test_synthetic_tiny_serves_a_completion():
    s = Server("--synthetic", "--synthetic-config", "tiny", "--max-model-len", "1024")
    try:
        assert s.model == "tern-synthetic-tiny"
        log = s.log()
        assert "synthetic weights (seed 1, mxfp4 experts" in log
        assert "every layer has its own routed experts" in log
        body = json.dumps({"model": s.model, "prompt": "Hello there", "max_tokens": 6, "temperature": 0,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(s.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        reply = json.loads(urllib.request.urlopen(req, timeout=300).read())
        assert reply["usage"]["completion_tokens"] == 6
        assert reply["choices"][0]["finish_reason"] == "length"
        assert reply["choices"][0]["text"]
    finally:
        assert s.stop() == 0


def test_synthetic_refuses_a_model_directory(tmp_path):
    s = Server("--synthetic", "--model", str(tmp_path), wait=False)
    assert s.proc.wait(120) == 1
    assert "--synthetic serves random weights: it takes no --model" in s.log()
