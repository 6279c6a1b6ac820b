#!/usr/bin/env python3
"""Generate the odd-shape DeepSeek-V4 reference fixture (tests/fixtures/odd-mxfp4/, issue #17 item 3).

The tiny fixtures (make_fixtures.py) have power-of-two sizes everywhere. This one is built by the same code with
sizes that are not: hidden 320 (FP8 blocks of 128 end part-way), 6 heads in 3 output groups, head_dim 104 with 24
RoPE dims (80 no-RoPE dims: no multiple of 64, so DeepSeek's FP8 KV rows cannot hold it), q_lora_rank 96,
o_lora_rank 48, 6 routed experts with top-3, moe_intermediate_size 96, indexer head_dim 56, window 12, and another
YaRN (factor 4 over 4 096 positions). No MTP layer. Deterministic (fixed seeds, one CPU thread).

    python3 tools/reference/make_odd_fixture.py            # writes tests/fixtures/odd-mxfp4/
    python3 tools/reference/make_odd_fixture.py --out DIR  # writes DIR/odd-mxfp4/

Writes config.json, the checkpoint (MXFP4 experts, two shards), reference.safetensors (per prompt p:
"prompt.<p>.ids", ".logits" [T, vocab] of the no-cache forward, ".greedy" and ".greedy_logits" of GREEDY_STEPS
greedy steps) and fixture.json (sizes, seeds, draw attempts, margins and gaps, sha256 of every file).
"""

import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (every size below replaces its module constant)

SIZES = dict(VOCAB=512, D=320, NL=4, NH=6, HD=104, ROPE=24, QR=96, OG=3, OR=48, NE=6, TOPK_E=3, FF=96, NHASH=2,
             COMPRESS=[0, 4, 8, 4], IH=4, IHD=56, ITOPK=4, HC=4, SWA=12, YARN_FACTOR=4, YARN_ORIGINAL_MAX=4096)
NAME = "odd-mxfp4"
WEIGHT_SEED = 20261204
PROMPT_SEED = 4242
PROMPT_LENS = [1, 3, 5, 11, 12, 13, 25, 37, 50]
GREEDY_STEPS = 16
MAX_ATTEMPTS = 300
# The same robustness rules as the tiny fixtures' main set: greedy margins, router and indexer gaps at every
# position, so that tern's other summation order cannot flip a decision.
MARGIN_REL_MIN = mf.MARGIN_REL_MIN
ROUTER_GAP_MIN = mf.ROUTER_GAP_MIN
INDEXER_REL_GAP_MIN = mf.INDEXER_REL_GAP_MIN


def configure():
    for k, v in SIZES.items():
        assert hasattr(mf, k), k
        setattr(mf, k, v)
    mf.NOPE = mf.HD - mf.ROPE
    mf.WEIGHT_SEED = WEIGHT_SEED
    mf.PROMPT_SEED = PROMPT_SEED


def official_config():
    c = mf.official_config("mxfp4")
    c["num_nextn_predict_layers"] = 0
    c["compress_ratios"] = list(mf.COMPRESS)
    return c


def draw(model, gaps, i, T):
    """The first draw of prompt i (length T) whose reference run keeps every decision clear: -> dict or None."""
    for attempt in range(MAX_ATTEMPTS):
        ids = mf.draw_prompt(i, attempt, T)
        gaps.reset()
        logits = mf.forward_logits(model, ids)
        toks, step_logits, margins, _ = mf.greedy(model, ids, steps=GREEDY_STEPS)
        ok = (min(margins) >= MARGIN_REL_MIN and gaps.router >= ROUTER_GAP_MIN and
              gaps.indexer_rel >= INDEXER_REL_GAP_MIN and gaps.indexer_zero_ties == 0)
        if ok:
            return dict(ids=ids, logits=logits, greedy=toks, greedy_logits=step_logits, attempt=attempt,
                        margin=min(margins), router_gap=gaps.router, indexer_rel_gap=gaps.indexer_rel)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(mf.REPO, "tests", "fixtures"))
    args = ap.parse_args()
    configure()
    out = os.path.join(os.path.abspath(args.out), NAME)
    os.makedirs(out, exist_ok=True)

    cfg = mf.hf_config()
    print("transformers", mf.transformers.__version__, "torch", torch.__version__)
    print("layer_types", cfg.layer_types, "mlp_layer_types", cfg.mlp_layer_types)
    print("rope_parameters", cfg.rope_parameters)
    W = mf.make_master_weights()
    ckpt, deq = mf.quantize_checkpoint(W, "mxfp4")
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(official_config(), f, indent=2)
        f.write("\n")
    files = ["config.json"] + mf.write_checkpoint(out, ckpt, "mxfp4")
    # The written files decode (independently) to the weights the reference runs.
    back = mf.dequantize_from_files(mf.read_checkpoint(out), "mxfp4")
    assert set(back) == set(deq), set(back) ^ set(deq)
    for k, v in deq.items():
        assert torch.equal(back[k], v), k
    model = mf.build_model(deq)
    gaps = mf.Gaps()
    hooks = mf.install_gap_hooks(model, gaps)

    ref, stats = {}, []
    for i, T in enumerate(PROMPT_LENS):
        r = draw(model, gaps, i, T)
        assert r is not None, f"prompt {i} (length {T}): no draw of {MAX_ATTEMPTS} keeps every decision clear"
        for key in ("ids", "logits", "greedy", "greedy_logits"):
            ref[f"prompt.{i}.{key}"] = r[key].contiguous()
        stats.append({k: r[k] for k in ("attempt", "margin", "router_gap", "indexer_rel_gap")} | {"length": T})
        print(f"prompt {i} length {T}: attempt {r['attempt']} margin {r['margin']:.2e} router gap "
              f"{r['router_gap']:.2e} indexer gap {r['indexer_rel_gap']:.2e}", flush=True)
    for h in hooks:
        h.remove()
    save_file(ref, os.path.join(out, "reference.safetensors"), metadata={"format": "pt"})
    files.append("reference.safetensors")

    def finite(o):  # strict JSON: inf (no indexer decision in a prompt) -> null
        if isinstance(o, float) and not torch.isfinite(torch.tensor(o)):
            return None
        return {k: finite(v) for k, v in o.items()} if isinstance(o, dict) else [finite(v) for v in o] \
            if isinstance(o, list) else o

    summary = {
        "generator": "tools/reference/make_odd_fixture.py", "transformers": mf.transformers.__version__,
        "torch": torch.__version__, "sizes": SIZES, "weight_seed": WEIGHT_SEED, "prompt_seed": PROMPT_SEED,
        "greedy_steps": GREEDY_STEPS, "margin_rel_min": MARGIN_REL_MIN, "router_gap_min": ROUTER_GAP_MIN,
        "indexer_rel_gap_min": INDEXER_REL_GAP_MIN, "prompts": stats,
        "files": {f: {"bytes": os.path.getsize(os.path.join(out, f)), "sha256": mf.sha256(os.path.join(out, f))}
                  for f in files},
    }
    with open(os.path.join(out, "fixture.json"), "w") as f:
        json.dump(finite(summary), f, indent=2)
        f.write("\n")
    print("wrote", out, sum(v["bytes"] for v in summary["files"].values()), "bytes")


if __name__ == "__main__":
    main()
