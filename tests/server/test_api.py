"""The OpenAI-compatible API through the official `openai` SDK and curl, against a real `tern serve`."""
import concurrent.futures
import json
import subprocess

import openai
import pytest

from conftest import DEVICE_ARGS, TERN_BIN, Server, metric, metrics_text, wait_for

PROMPT = [0, 4871, 1307, 344, 260, 5206, 19, 1435, 2212]  # token ids


def test_models_health_tokenize(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == [server.model]
    out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", server.url + "/health"],
                         capture_output=True, text=True, check=True)
    assert out.stdout == "200"
    tok = json.loads(subprocess.run(["curl", "-s", server.url + "/tokenize", "-d", '{"prompt": "Hello world"}'],
                                    capture_output=True, text=True, check=True).stdout)
    assert tok["count"] == len(tok["tokens"]) > 0
    detok = json.loads(subprocess.run(["curl", "-s", server.url + "/detokenize", "-d",
                                       json.dumps({"tokens": tok["tokens"]})],
                                      capture_output=True, text=True, check=True).stdout)
    assert detok["prompt"] == "Hello world"


def test_curl_large_body_needs_no_expect_wait(server):
    """curl sends `Expect: 100-continue` with bodies over 1 KiB; the server answers at once, so curl does
    not wait its one-second default."""
    body = json.dumps({"prompt": "hello " * 1000})
    out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{time_total}", server.url + "/tokenize",
                          "-H", "Content-Type: application/json", "-d", body], capture_output=True, text=True, check=True)
    code, seconds = out.stdout.split()
    assert code == "200" and float(seconds) < 0.9


def test_completion_and_usage(client, server):
    r = client.completions.create(model=server.model, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert len(r.choices) == 1 and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8


def test_chat_nonstream_and_stream_agree(client, server):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
    whole = client.chat.completions.create(model=server.model, messages=msgs, max_tokens=12, temperature=0)
    assert whole.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model=server.model, messages=msgs, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    # No content-less role chunk first: the first chunk carries the role and content together.
    first = chunks[0].choices[0].delta
    assert first.role == "assistant" and first.content
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_streamed_completion_usage_last(client, server):
    chunks = list(client.completions.create(model=server.model, prompt=PROMPT, max_tokens=6, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].usage.prompt_tokens == len(PROMPT)
    assert all(c.usage is None for c in chunks[:-1])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_n_choices_and_seeds(client, server):
    kw = dict(model=server.model, prompt=PROMPT, max_tokens=10, temperature=1.0, top_p=0.9)
    a = client.completions.create(n=3, seed=1234, **kw)
    b = client.completions.create(n=3, seed=1234, **kw)
    c = client.completions.create(n=3, seed=999, **kw)
    assert sorted(x.index for x in a.choices) == [0, 1, 2]
    texts = lambda r: [x.text for x in sorted(r.choices, key=lambda x: x.index)]
    assert texts(a) == texts(b)
    assert texts(a) != texts(c)
    assert len(set(texts(a))) > 1  # each choice its own random stream
    assert a.usage.completion_tokens == 30


def test_thinking_and_tools(client, server):
    """Thinking mode puts the output before </think> into reasoning_content (the tiny model never closes
    it, so everything is reasoning); tools are accepted and described to the model."""
    r = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "think"}],
                                       max_tokens=6, temperature=0, extra_body={"chat_template_kwargs": {"thinking": True}})
    msg = r.choices[0].message
    assert (msg.model_extra or {}).get("reasoning_content") and not msg.content
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    plain = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "weather?"}],
                                           max_tokens=4, temperature=0)
    with_tools = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "weather?"}],
                                                max_tokens=4, temperature=0, tools=tools, tool_choice="auto")
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens  # the tool schema is in the prompt
    assert with_tools.choices[0].finish_reason in ("length", "stop", "tool_calls")


def test_logprobs(client, server):
    r = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "x"}], max_tokens=5,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 5
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-5)
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob >= entry.top_logprobs[2].logprob
    c = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == c.choices[0].text


def test_stop_strings_across_tokens(client, server):
    full = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    assert len(full) > 6
    stop = full[3:6]  # most likely spans a token boundary or sits inside one: matched either way
    r = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop])
    assert r.choices[0].text == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(
        model=server.model, prompt=PROMPT, max_tokens=24, temperature=0, stop=stop, stream=True) if ch.choices)
    assert streamed == r.choices[0].text


def _post(server, path, body):
    r = subprocess.run(["curl", "-s", server.url + path, "-d", json.dumps(body)], capture_output=True, text=True,
                       check=True)
    return json.loads(r.stdout)


def test_stop_token_ids_and_ignore_eos(client, server):
    full = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text
    ids = _post(server, "/tokenize", {"prompt": full, "add_special_tokens": False})["tokens"]
    r = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=8, temperature=0,
                                  extra_body={"stop_token_ids": [ids[2]], "ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert full.startswith(r.choices[0].text) and len(r.choices[0].text) < len(full)
    # The stop token counts in usage and shows in logprobs (as in vLLM), streamed or not; its text does not.
    body = dict(model=server.model, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=0,
                extra_body={"stop_token_ids": [ids[2]], "ignore_eos": True})
    r = client.completions.create(**body)
    assert len(r.choices[0].logprobs.tokens) == r.usage.completion_tokens
    seen, usage = 0, None
    for ch in client.completions.create(**body, stream=True, stream_options={"include_usage": True}):
        usage = ch.usage or usage
        seen += sum(len(c.logprobs.tokens) for c in ch.choices if c.logprobs)
    assert seen == usage.completion_tokens == r.usage.completion_tokens


def test_penalties_and_filters_accepted(client, server):
    r = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=6, temperature=0.7, seed=5,
                                  presence_penalty=0.5, frequency_penalty=0.5,
                                  extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1})
    assert r.usage.completion_tokens == 6


def _greedy_ids(server, prompt, n):
    r = subprocess.run(["curl", "-s", server.url + "/v1/completions", "-d",
                        json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": 0})],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["choices"][0]["text"]


def test_batch_invariance_64_concurrent_streams(client, server):
    """Greedy tokens do not depend on what else is in the batch: 64 concurrent streams (prompts of
    different lengths, so prefill chunks and decodes mix) equal each request run alone. On a GPU the claim is
    --batch-invariant's: by default the paths chosen by a step's token count (the grouped MoE kernels from 65
    tokens, library products from 512) are not batch invariant, as in vLLM and SGLang (docs/cuda-backend.md)."""
    if DEVICE_ARGS:
        own = Server("--header-timeout", "2", "--max-model-len", "2048", "--batch-invariant")
        try:
            _batch_invariance(openai.OpenAI(base_url=own.url + "/v1", api_key="none", max_retries=0, timeout=300), own)
        finally:
            own.stop()
    else:
        _batch_invariance(client, server)


def _batch_invariance(client, server):
    prompts = [[(7 * i + 3 * j) % 5000 + 100 for j in range(3 + i % 13)] for i in range(64)]

    def stream(p):
        s = client.completions.create(model=server.model, prompt=p, max_tokens=8, temperature=0, stream=True)
        return "".join(ch.choices[0].text for ch in s if ch.choices)

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        together = list(pool.map(stream, prompts))
    alone = [_greedy_ids(server, p, 8) for p in prompts]  # one at a time
    assert together == alone


def test_greedy_equals_tern_run(server):
    """The server's greedy tokens are those of `tern run` (one sequence, no engine) for the same model."""
    help_text = subprocess.run([TERN_BIN, "--help"], capture_output=True, text=True).stdout
    if " run " not in help_text and "\n  run" not in help_text:
        pytest.skip("tern run is not built")
    out = subprocess.run([TERN_BIN, "run", *DEVICE_ARGS, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens", "8"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    line = next(l for l in out.stdout.splitlines() if l.startswith("tokens:"))
    ids = [int(t) for t in line.split(":")[1].split()]
    assert len(ids) == 8
    detok = _post(server, "/detokenize", {"tokens": ids})["prompt"]
    assert detok == _greedy_ids(server, PROMPT, 8)


def test_errors_through_sdk(client, server):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=server.model, prompt="x", max_tokens=-1)
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=server.model, prompt=[1] * 3000, max_tokens=2)  # beyond --max-model-len
    assert metric(server, "num_requests_running") == 0 or wait_for(lambda: metric(server, "num_requests_running") == 0)


def test_step_paths_in_metrics(client, server):
    """Every engine step is counted once: replayed from a CUDA graph or eager, eager ones by reason."""
    client.completions.create(model=server.model, prompt="count the steps", max_tokens=6, temperature=0)
    # One snapshot of an idle server (requests of earlier tests may still be finishing: each fetch of /metrics
    # between their steps would see other counts).
    assert wait_for(lambda: metric(server, "num_requests_running") == 0 and metric(server, "num_requests_waiting") == 0)
    text = metrics_text(server)
    steps = metric(server, "engine_steps_total", text)
    graphs = metric(server, "cuda_graph_replays_total", text)
    eager = metric(server, "eager_steps_total", text)
    assert steps > 0 and graphs + eager == steps
    assert metric(server, "eager_steps_by_reason_total", text) == eager
    if not DEVICE_ARGS or "cpu" in DEVICE_ARGS:
        assert graphs == 0  # the CPU model runs every step eagerly ("the model is on the CPU")
    else:
        assert graphs > 0  # the decode steps of a lone request replay graphs


def _path_tokens(text, path):
    prefix = "tern:eager_step_tokens_total{"
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith(prefix) and f'path="{path}"' in l)


def test_mixed_steps_in_metrics(client, server):
    """A prompt admitted while another request decodes shares its step: the prompt per sequence, the decode token on
    the step tables (a mixed step), and /metrics says so."""
    before = metrics_text(server)
    mixed0, chunk0 = metric(server, "mixed_steps_total", before), _path_tokens(before, "per_sequence")
    stream = client.completions.create(model=server.model, prompt=[11, 12, 13], max_tokens=160, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    chunks = iter(stream)
    next(chunks)  # the first request decodes now
    second = client.completions.create(model=server.model, prompt=list(range(20, 60)), max_tokens=2, temperature=0)
    rest = list(chunks)
    assert second.usage.prompt_tokens == 40 and rest
    assert wait_for(lambda: metric(server, "num_requests_running") == 0 and metric(server, "num_requests_waiting") == 0)
    text = metrics_text(server)
    # The 40-token prompt ran per sequence (tokens past the tables' four a sequence), beside the first request's
    # decode token on the tables.
    assert _path_tokens(text, "per_sequence") - chunk0 >= 40
    assert metric(server, "mixed_steps_total", text) - mixed0 >= 1
    if not DEVICE_ARGS or "cpu" in DEVICE_ARGS:
        assert _path_tokens(text, "step_tables") > 0  # the CPU runs its decode steps eagerly, on the tables
