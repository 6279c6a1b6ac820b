"""MTP speculative decoding through `tern serve` (issue #18, docs/mtp.md): real servers on loopback, the openai SDK.

The embedded tiny model has an MTP layer with random weights, so its drafts are almost never right; greedy output
must equal the plain server's token for token either way (chat and completions, logprobs, stop strings, penalties,
16 requests in flight). The oracle mode (benchmarks only) keeps drafts by chance and says so; the counters add up;
`--speculative auto` refuses to start without a measured threshold and starts with one or with
--speculative-max-batch."""
import concurrent.futures
import json
import os

from conftest import Server, metric, metrics_text, wait_for

PROMPTS = ["The quick brown fox", "Once upon a time in a land far away there lived", "1, 2, 3,", "def f(x):",
           "Hello", "A list of colours: red, green,"]


def client_of(s):
    import openai
    return openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=300)


def completion(c, s, prompt, **kw):
    return c.completions.create(model=s.model, prompt=prompt, temperature=0, max_tokens=kw.pop("max_tokens", 20),
                                extra_body={"ignore_eos": True}, **kw).choices[0]


def chat(c, s, prompt, **kw):
    return c.chat.completions.create(model=s.model, messages=[{"role": "user", "content": prompt}], temperature=0,
                                     max_tokens=kw.pop("max_tokens", 16), **kw).choices[0]


def test_greedy_output_equals_the_plain_server():
    plain = Server("--max-model-len", "1024")
    spec = Server("--max-model-len", "1024", "--speculative", "mtp", "--num-speculative-tokens", "3")
    try:
        log = spec.log()
        assert "speculative decoding: MTP, 3 drafts a round, at every batch size" in log
        assert "rollback memory" in log and "reserved up front" in log
        pc, sc = client_of(plain), client_of(spec)
        for p in PROMPTS:
            a, b = completion(pc, plain, p, logprobs=2), completion(sc, spec, p, logprobs=2)
            assert a.text == b.text, p
            assert a.logprobs.tokens == b.logprobs.tokens
            for x, y in zip(a.logprobs.token_logprobs, b.logprobs.token_logprobs):
                assert abs(x - y) < 1e-3
            # penalties read the emitted history, drafts included
            a = completion(pc, plain, p, frequency_penalty=1.5, presence_penalty=0.5)
            b = completion(sc, spec, p, frequency_penalty=1.5, presence_penalty=0.5)
            assert a.text == b.text, p
        for p in PROMPTS[:3]:
            a = chat(pc, plain, p)
            assert chat(sc, spec, p).message.content == a.message.content
            # a stop string from the plain output ends both at the same place
            words = a.message.content.split()
            if len(words) > 3:
                a2, b2 = chat(pc, plain, p, stop=[words[2]]), chat(sc, spec, p, stop=[words[2]])
                assert a2.message.content == b2.message.content and a2.finish_reason == b2.finish_reason == "stop"
        # 16 in flight: the verify steps batch sequences of several tokens each
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            want = list(pool.map(lambda i: completion(pc, plain, PROMPTS[i % 6] * (1 + i % 3), max_tokens=24).text,
                                 range(16)))
            got = list(pool.map(lambda i: completion(sc, spec, PROMPTS[i % 6] * (1 + i % 3), max_tokens=24).text,
                                range(16)))
        assert got == want
        drafts = metric(spec, "spec_decode_num_drafts_total")
        assert drafts > 0
        assert metric(spec, "spec_decode_num_draft_tokens_total") >= drafts
        text = metrics_text(spec)
        assert 'position="2"' in text and "tern:spec_decode_num_accepted_tokens_per_pos_total{" in text
        assert "kernel: speculative decoding: MTP, 3 drafts a round" in log  # which paths the rounds run on
        # The MTP rows (drafting rounds, catch-ups) counted apart from the engine's steps: on the CPU all eager, with why.
        assert metric(spec, "spec_decode_mtp_eager_total", text) >= drafts / 16
        assert 'tern:spec_decode_mtp_eager_total{' in text and 'reason="the model is on the CPU"' in text
        assert metric(spec, "spec_decode_mtp_graph_replays_total", text) == 0
        assert wait_for(lambda: metric(spec, "num_requests_running") == 0)
        text = metrics_text(spec)  # idle: no MTP rows among the trunk steps (one, or two: plain chunks and verify)
        trunk = metric(spec, "cuda_graph_replays_total", text) + metric(spec, "eager_steps_total", text)
        engine_steps = metric(spec, "engine_steps_total", text)
        assert 0 < engine_steps <= trunk <= 2 * engine_steps
        assert metric(plain, "spec_decode_num_drafts_total") == 0
    finally:
        assert plain.stop() == 0
        assert spec.stop() == 0


def test_oracle_mode_keeps_drafts_and_says_so():
    s = Server("--max-model-len", "1024", "--speculative", "mtp", "--num-speculative-tokens", "2",
               "--speculative-oracle-accept", "1")
    try:
        assert "BENCHMARK MODE" in s.log() and "ORACLE" in s.log()
        c = client_of(s)
        r = completion(c, s, "Hello there", max_tokens=31)
        assert len(r.text) > 0
        # every draft kept: 3 tokens a verify round after the first token
        assert metric(s, "spec_decode_num_accepted_tokens_total") == metric(s, "spec_decode_num_draft_tokens_total") > 0
        assert metric(s, "spec_decode_num_drafts_total") <= 11
    finally:
        assert s.stop() == 0


def test_auto_needs_a_measured_threshold(tmp_path):
    env = {"TERN_CACHE": str(tmp_path)}
    s = Server("--max-model-len", "1024", "--speculative", "auto", env=env, wait=False)
    assert s.proc.wait(300) == 1
    log = s.log()
    assert "--speculative auto: no measured threshold" in log
    assert "bench-step --speculative 3 --save-speculative-threshold" in log and "--speculative-max-batch" in log
    # A stored measurement (as bench-step writes it) for this device and model shape is used and printed.
    key = {"device": "cpu", "model": None, "k": 3}
    s = Server("--max-model-len", "1024", "--speculative", "auto", "--speculative-max-batch", "4", env=env)
    try:
        assert "while at most 4 sequences decode (--speculative-max-batch)" in s.log()
    finally:
        assert s.stop() == 0
    model_line = [l for l in log.splitlines() if "no measured threshold" in l][0]
    key["model"] = model_line.split(" with ", 1)[1].split(" in ", 1)[0]
    (tmp_path / "speculative-thresholds.json").write_text(json.dumps([{
        **key, "acceptance_length": 2.5, "max_batch": 8, "ratios": [{"batch": 1, "ratio": 1.4}, {"batch": 8, "ratio": 2.2}],
        "measured": "a test"}]))
    s = Server("--max-model-len", "1024", "--speculative", "auto", env=env)
    try:
        assert "while at most 8 sequences decode (--speculative auto: measured a test at acceptance length 2.5" in s.log()
        assert completion(client_of(s), s, "Hello", max_tokens=4).text
    finally:
        assert s.stop() == 0


def test_bad_speculative_flags_are_refused():
    for args, message in [(["--speculative", "eagle"], "--speculative: expected off, mtp or auto"),
                          (["--speculative", "mtp", "--num-speculative-tokens", "4"], "--num-speculative-tokens: 4"),
                          (["--speculative-oracle-accept", "0.5"], "need --speculative mtp or auto")]:
        s = Server("--max-model-len", "1024", *args, wait=False)
        assert s.proc.wait(300) == 1, args
        assert message in s.log(), (args, s.log()[-2000:])
