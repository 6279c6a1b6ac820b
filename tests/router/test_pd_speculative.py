"""MTP speculative decoding behind prefill-decode disaggregation (docs/disaggregation.md, docs/mtp.md): the state a
prefill server hands over carries the MTP layer's window and carry, so a decode server that speculates drafts from
its first step. Greedy outputs through router + prefill + decode, all speculating, equal one speculating `both`
server's, token for token and logprob for logprob, for prompts from 1 token to many windows; the decode server
drafts, the prefill server does not (its requests end with the first token)."""
import pytest

from cluster import metric, pd_processes, post
from test_pd_equal import completion, prompt


@pytest.fixture(scope="module")
def spec_cluster():
    with pd_processes("--speculative", "mtp", "--num-speculative-tokens", "2") as procs:
        yield procs


@pytest.mark.parametrize("n", [1, 5, 17, 64, 300])
def test_greedy_equal_with_mtp(spec_cluster, n):
    body = {"prompt": prompt(n, 7), "max_tokens": 12, "temperature": 0, "logprobs": 2, "ignore_eos": True}
    want = completion(spec_cluster["both"].url, body)
    got = completion(spec_cluster["router"].url, body)
    assert got == want


def test_decode_side_drafts_prefill_side_does_not(spec_cluster):
    status, j = post(spec_cluster["router"].url, "/v1/completions",
                     {"prompt": prompt(40, 8), "max_tokens": 10, "temperature": 0, "ignore_eos": True})
    assert status == 200, j
    assert metric(spec_cluster["decode"].url, "spec_decode_num_drafts_total") > 0
    assert metric(spec_cluster["prefill"].url, "spec_decode_num_drafts_total") == 0
