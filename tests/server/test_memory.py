"""State memory under pressure: a tight --state-memory makes the engine preempt (recompute) requests;
outputs stay those of an unconstrained server, nothing crashes, every page comes back."""
import concurrent.futures

import openai

from conftest import Server, metric, wait_for


def test_preemption_by_recomputation_keeps_greedy_outputs(server, client):
    prompts = [[(11 * i + 5 * j) % 7000 + 300 for j in range(20 + i % 16)] for i in range(24)]

    def generate(c, model, p):
        return c.completions.create(model=model, prompt=p, max_tokens=40, temperature=0).choices[0].text

    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        reference = list(pool.map(lambda p: generate(client, server.model, p), prompts))
    tight = Server("--state-memory", "2M", "--max-model-len", "4096")
    try:
        c = openai.OpenAI(base_url=tight.url + "/v1", api_key="x", max_retries=0, timeout=600)
        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            constrained = list(pool.map(lambda p: generate(c, tight.model, p), prompts))
        assert metric(tight, "num_preemptions_total") > 0
        assert constrained == reference
        assert wait_for(lambda: metric(tight, "state_memory_used_bytes") == 0)
        # A prompt whose state can never fit is refused up front, not crashed on.
        try:
            c.completions.create(model=tight.model, prompt=[7] * 3000, max_tokens=1)
            assert False, "expected a 400"
        except openai.BadRequestError as e:
            assert "state memory" in str(e)
    finally:
        assert tight.stop() == 0
