#!/usr/bin/env python3
"""Independent re-implementation of the tiny DeepSeek-V4 forward (from deepseek-v4.md section 2, written
without calling any transformers module) checked against the transformers reference, plus experiments
behind the "Reference semantics notes" of tests/fixtures/README.md.

Usage (from the repository root, after make_fixtures.py):

    python3 tools/reference/check_semantics.py [--fixtures tests/fixtures]

It reads the written checkpoints (so it also checks that the files decode to what the reference used) and
prints: max |logit| difference per prompt between this implementation and the stored fixtures (fp32 and
FP8-KV mode), the result of each semantic experiment, and how much each deliberately wrong variant of the
semantics ("mutation") moves the logits (showing that the fixtures can detect it).
"""

import argparse
import json
import math
import os
import sys
import tempfile

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (also installs the FP8-KV attention wrapper, off by default)

torch.set_num_threads(1)
EPS = 1e-6


# ----------------------------------------------------------------------------------------------
# Independent forward
# ----------------------------------------------------------------------------------------------
def rmsnorm(x, w=None, eps=EPS):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def yarn_inv_freq(dim=64, base=160000.0, factor=16.0, orig=65536, beta_fast=32, beta_slow=1):
    def corr_dim(rot):
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))
    low = max(math.floor(corr_dim(beta_fast)), 0)
    high = min(math.ceil(corr_dim(beta_slow)), dim - 1)
    extrap = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    return extrap / factor * ramp + extrap * (1 - ramp), (low, high)


def plain_inv_freq(dim=64, base=10000.0):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


ROPE_HALF_SPLIT = [False]


def rope(x, pos, inv_freq, inverse=False):
    """Interleaved RoPE on the last 64 dims of x [..., n, d] at positions pos [n]."""
    ang = pos.float()[:, None] * inv_freq[None, :]  # [n, 32] fp32
    cos, sin = ang.cos(), ang.sin()
    if inverse:
        sin = -sin
    shape = [1] * (x.dim() - 2) + list(cos.shape)
    cos, sin = cos.view(shape), sin.view(shape)
    r = x[..., -64:]
    if ROPE_HALF_SPLIT[0]:
        a, b = r[..., :32], r[..., 32:]
        out = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    else:
        a, b = r[..., 0::2], r[..., 1::2]
        out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    return torch.cat([x[..., :-64], out], dim=-1)


class Opts:
    """Semantic switches; the defaults are the transformers semantics. Mutations flip one of them."""
    window = 16                 # query p sees window keys p-window+1 .. p
    visible_plus1 = True        # compressed entry w visible iff w < (p+1)//c   (False: w < p//c)
    csa_overlap = True          # CSA entry w pools window w-1's first half + window w's second half
    comp_pos_first = True       # compressed RoPE position w*c (False: w*c + c - 1)
    sink = True
    inverse_rope = True
    hc_transpose = True         # X'_k = sum_j C[j,k] X_j   (False: sum_j C[k,j] X_j)
    clamp_shared = True         # SwiGLU clamp on the shared expert too
    clamp_routed = True         # SwiGLU clamp on the routed experts
    bias_in_weights = False     # (wrong) routing weights taken from score+bias instead of score
    rope_half_split = False     # (wrong) RoPE pairs (i, i+32) instead of interleaved (2i, 2i+1)
    yarn_compress = True        # compress layers use YaRN theta 160000 (False: plain theta 160000)
    indexer = True              # CSA uses the indexer top-k (False: all visible entries)
    comp_skip_window = False    # (wrong) drop compressed entries whose tokens overlap the query's window
    fp8kv = False
    actfp8 = False              # --activations fp8: x quantised before every FP8 / FP4 product (act_quant)


def fp8_kv_round(kv):
    return mf.fp8_kv_round(kv)


def act_quant(x):
    """The official reference's activation quantisation, dequantised: each 128 values of the last dim divided by
    2^ceil(log2(max(amax, 1e-4) / 448)) (the exponent in double) and rounded to e4m3, times the scale."""
    blk = x.reshape(*x.shape[:-1], x.shape[-1] // 128, 128)
    amax = blk.abs().amax(-1, keepdim=True).clamp(min=1e-4)
    scale = torch.pow(2.0, torch.ceil(torch.log2(amax.double() / 448.0))).to(x.dtype)
    return ((blk / scale).to(torch.float8_e4m3fn).to(x.dtype) * scale).reshape(x.shape)


def quantiser(opts):
    return act_quant if opts.actfp8 else (lambda t: t)


def compressor(h, W, pre, c, d, overlap, opts, inv_freq):
    T = h.shape[0]
    a = h @ W[pre + "wkv.weight"].T
    g = h @ W[pre + "wgate.weight"].T + W[pre + "ape"][torch.arange(T) % c]
    n = T // c
    rows = []
    for w in range(n):
        t = torch.arange(w * c, (w + 1) * c)
        if overlap:
            cand_a, cand_g = [a[t, d:]], [g[t, d:]]
            if w >= 1 and opts.csa_overlap:
                tp = t - c
                cand_a.insert(0, a[tp, :d])
                cand_g.insert(0, g[tp, :d])
            ca, cg = torch.cat(cand_a), torch.cat(cand_g)
        else:
            ca, cg = a[t], g[t]
        rows.append((torch.softmax(cg, dim=0) * ca).sum(0))
    if n == 0:
        return torch.zeros(0, d)
    E = rmsnorm(torch.stack(rows), W[pre + "norm.weight"])
    pos = torch.arange(n) * c + (0 if opts.comp_pos_first else c - 1)
    return rope(E, pos, inv_freq)


def attention(L, h, W, opts, rec):
    T = h.shape[0]
    c = mf.COMPRESS[L]
    pre = f"layers.{L}.attn."
    if c == 0:
        inv = plain_inv_freq()
    else:
        inv = yarn_inv_freq()[0] if opts.yarn_compress else plain_inv_freq(base=160000.0)
    pos = torch.arange(T)
    aq = quantiser(opts)  # the FP8 linears' inputs (identity unless opts.actfp8)
    cq = rmsnorm(aq(h) @ W[pre + "wq_a.weight"].T, W[pre + "q_norm.weight"])
    q = (aq(cq) @ W[pre + "wq_b.weight"].T).view(T, mf.NH, mf.HD).transpose(0, 1)  # [NH, T, HD]
    q = rope(rmsnorm(q), pos, inv)
    kv = rope(rmsnorm(aq(h) @ W[pre + "wkv.weight"].T, W[pre + "kv_norm.weight"]), pos, inv)  # [T, HD]
    E = compressor(h, W, pre + "compressor.", c, mf.HD, c == 4, opts, inv) if c else torch.zeros(0, mf.HD)
    if opts.fp8kv:
        kv, E = fp8_kv_round(kv), fp8_kv_round(E)
    n = E.shape[0]
    # visibility mask [T, T + n]
    p = pos[:, None]
    j = torch.arange(T)[None, :]
    win = (j <= p) & (j > p - opts.window)
    limit = (pos + 1) // c if (c and opts.visible_plus1) else (pos // c if c else pos * 0)
    comp = torch.arange(n)[None, :] < limit[:, None]
    if opts.comp_skip_window and c:
        comp = comp & ((torch.arange(n)[None, :] + 1) * c - 1 <= p - opts.window)
    if c == 4 and opts.indexer and n:
        qi = (aq(cq) @ W[pre + "indexer.wq_b.weight"].T).view(T, mf.IH, mf.IHD)
        qi = rope(qi.transpose(0, 1), pos, inv).transpose(0, 1)  # [T, IH, IHD]
        KI = compressor(h, W, pre + "indexer.compressor.", c, mf.IHD, True, opts, inv)
        wts = (h @ W[pre + "indexer.weights_proj.weight"].T) * mf.IH ** -0.5  # [T, IH]
        sc = (torch.relu(torch.einsum("thd,sd->ths", qi, KI)) * mf.IHD ** -0.5 * wts[..., None]).sum(1)
        sc = sc.masked_fill(~comp, float("-inf"))
        pick = torch.zeros_like(comp)
        for t in range(T):
            nv = int(comp[t].sum())
            k = min(mf.ITOPK, nv)
            if k:
                pick[t, sc[t].topk(k).indices] = True
        rec[f"layer{L}.pick"] = pick
        comp = comp & pick
    mask = torch.cat([win, comp], dim=1)
    K = torch.cat([kv, E], dim=0)  # [T+n, HD]
    s = torch.einsum("htd,jd->htj", q, K) * mf.HD ** -0.5
    s = s.masked_fill(~mask[None], float("-inf"))
    sink = W[pre + "attn_sink"][:, None, None]
    mx = s.amax(-1, keepdim=True)
    if opts.sink:
        mx = torch.maximum(mx, sink)
    e = torch.exp(s - mx)
    den = e.sum(-1, keepdim=True) + (torch.exp(sink - mx) if opts.sink else 0)
    o = (e / den) @ K  # [NH, T, HD]
    if opts.inverse_rope:
        o = rope(o, pos, inv, inverse=True)
    o = o.transpose(0, 1)  # [T, NH, HD]
    hpg = mf.NH // mf.OG
    wo_a = W[pre + "wo_a.weight"].view(mf.OG, mf.OR, hpg * mf.HD)
    grp = torch.stack([aq(o[:, g * hpg:(g + 1) * hpg].reshape(T, -1)) @ wo_a[g].T for g in range(mf.OG)], 1)
    return aq(grp.reshape(T, -1)) @ W[pre + "wo_b.weight"].T


def swiglu(x, w1, w2, w3, clamp=True, aq=lambda t: t):
    gt, up = aq(x) @ w1.T, aq(x) @ w3.T
    if clamp:
        gt, up = gt.clamp(max=10.0), up.clamp(-10.0, 10.0)
    return aq(F.silu(gt) * up) @ w2.T


def moe(L, h, ids, W, opts):
    pre = f"layers.{L}.ffn."
    s = torch.sqrt(F.softplus(h @ W[pre + "gate.weight"].T))  # [T, NE]
    if L < mf.NHASH:
        idx = W[pre + "gate.tid2eid"][ids]
    else:
        idx = (s + W[pre + "gate.bias"]).topk(mf.TOPK_E, dim=-1).indices
    wts = (s + W[pre + "gate.bias"]).gather(1, idx) if (opts.bias_in_weights and L >= mf.NHASH) else s.gather(1, idx)
    wts = wts / wts.sum(-1, keepdim=True) * 1.5
    y = torch.zeros_like(h)
    for t in range(h.shape[0]):
        for k in range(mf.TOPK_E):
            e = int(idx[t, k])
            ex = pre + f"experts.{e}."
            y[t] += wts[t, k] * swiglu(h[t:t + 1], W[ex + "w1.weight"], W[ex + "w2.weight"], W[ex + "w3.weight"],
                                           clamp=opts.clamp_routed, aq=quantiser(opts))[0]
    sh = pre + "shared_experts."
    return y + swiglu(h, W[sh + "w1.weight"], W[sh + "w2.weight"], W[sh + "w3.weight"], clamp=opts.clamp_shared,
                      aq=quantiser(opts))


def hc_site(X, W, pre, norm_w, sub, opts):
    T = X.shape[0]
    f = X.reshape(T, -1)
    m = (f @ W[pre + "_fn"].T) * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + EPS)
    base, scale = W[pre + "_base"], W[pre + "_scale"]
    pre_w = torch.sigmoid(m[:, :4] * scale[0] + base[:4]) + 1e-6
    post = 2 * torch.sigmoid(m[:, 4:8] * scale[1] + base[4:8])
    C = torch.softmax(m[:, 8:].view(T, 4, 4) * scale[2] + base[8:].view(4, 4), dim=-1) + 1e-6
    C = C / (C.sum(-2, keepdim=True) + 1e-6)
    for _ in range(19):
        C = C / (C.sum(-1, keepdim=True) + 1e-6)
        C = C / (C.sum(-2, keepdim=True) + 1e-6)
    a = sub(rmsnorm((pre_w[..., None] * X).sum(1), norm_w))
    mix = torch.einsum("tjk,tjd->tkd", C, X) if opts.hc_transpose else torch.einsum("tkj,tjd->tkd", C, X)
    return post[..., None] * a[:, None, :] + mix, a


@torch.no_grad()
def forward(W, ids, opts=None, rec=None):
    opts = opts or Opts()
    rec = {} if rec is None else rec
    ROPE_HALF_SPLIT[0] = opts.rope_half_split
    x = W["embed.weight"][ids]
    X = x[:, None, :].repeat(1, 4, 1)
    for L in range(mf.NL):
        X, a = hc_site(X, W, f"layers.{L}.hc_attn", W[f"layers.{L}.attn_norm.weight"],
                       lambda h: attention(L, h, W, opts, rec), opts)
        rec[f"layer{L}.attn_out"] = a
        X, a = hc_site(X, W, f"layers.{L}.hc_ffn", W[f"layers.{L}.ffn_norm.weight"],
                       lambda h: moe(L, h, ids, W, opts), opts)
        rec[f"layer{L}.ffn_out"] = a
        rec[f"layer{L}.streams"] = X
    T = X.shape[0]
    f = X.reshape(T, -1)
    m = (f @ W["hc_head_fn"].T) * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + EPS)
    pre_w = torch.sigmoid(m * W["hc_head_scale"] + W["hc_head_base"]) + 1e-6
    y = rmsnorm((pre_w[..., None] * X).sum(1), W["norm.weight"])
    rec["final_hidden"] = y
    return y @ W["head.weight"].T


# ----------------------------------------------------------------------------------------------
def write_act_fp8_reference(fx, man, out):
    """Every prompt's logits with act_quant before each FP8 / FP4 product (opts.actfp8), per variant."""
    for v in man["variants"]:
        vdir = os.path.join(fx, f"tiny-{v}")
        W = mf.dequantize_from_files(mf.read_checkpoint(vdir), v)
        ref = load_file(os.path.join(vdir, "reference.safetensors"))
        o = Opts()
        o.actfp8 = True
        res, moved = {}, 0.0
        for i in range(len(man["prompt_lengths"])):
            ids = ref[f"prompt.{i}.ids"]
            lg = forward(W, ids, o).float().contiguous()
            res[f"prompt.{i}.logits"] = lg
            moved = max(moved, ((lg - ref[f"prompt.{i}.logits"]).abs().max() / ref[f"prompt.{i}.logits"].abs().max()).item())
        os.makedirs(os.path.join(out, f"tiny-{v}"), exist_ok=True)
        save_file(res, os.path.join(out, f"tiny-{v}", "act_fp8_reference.safetensors"))
        print(f"[{v}] act fp8 logits of {len(res)} prompts written; they move from the f32 activations' by up to "
              f"{moved:.3e} of max|logit|")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default=os.path.join(mf.REPO, "tests", "fixtures"))
    ap.add_argument("--act-fp8-out", default="", metavar="DIR",
                    help="only write DIR/tiny-<variant>/act_fp8_reference.safetensors: every prompt's logits with the "
                         "official reference's activation quantisation (tern's --activations fp8), f32 KV rows")
    args = ap.parse_args()
    fx = args.fixtures
    man = json.load(open(os.path.join(fx, "manifest.json")))
    report = {}
    if args.act_fp8_out:
        write_act_fp8_reference(fx, man, args.act_fp8_out)
        return

    # 0. rope tables
    inv_y, (lo, hi) = yarn_inv_freq()
    ref = load_file(os.path.join(fx, "tiny-mxfp4", "reference.safetensors"))
    print(f"yarn correction range low={lo} high={hi}; "
          f"|inv_freq - transformers| compress {(inv_y - ref['rope.compress.inv_freq']).abs().max():.2e} "
          f"main {(plain_inv_freq() - ref['rope.main.inv_freq']).abs().max():.2e}")

    for v in man["variants"]:
        vdir = os.path.join(fx, f"tiny-{v}")
        W = mf.dequantize_from_files(mf.read_checkpoint(vdir), v)
        ref = load_file(os.path.join(vdir, "reference.safetensors"))
        worst, worst8, worst_rel = 0.0, 0.0, 0.0
        for i in range(len(man["prompt_lengths"])):
            ids = ref[f"prompt.{i}.ids"]
            lg = forward(W, ids)
            d = (lg - ref[f"prompt.{i}.logits"]).abs().max().item()
            worst = max(worst, d)
            worst_rel = max(worst_rel, d / ref[f"prompt.{i}.logits"].abs().max().item())
            o8 = Opts()
            o8.fp8kv = True
            d8 = (forward(W, ids, o8) - ref[f"prompt.{i}.logits_fp8kv"]).abs().max().item()
            worst8 = max(worst8, d8)
            # greedy continuation: last-row argmax of the extended sequences
            seq = torch.cat([ids, ref[f"prompt.{i}.greedy"]])
            full = forward(W, seq)
            T = len(ids)
            agree = torch.equal(full[T - 1:T - 1 + mf.GREEDY_STEPS].argmax(-1), ref[f"prompt.{i}.greedy"])
            assert agree, (v, i)
        print(f"[{v}] independent vs transformers: max|dlogit| {worst:.2e} (rel {worst_rel:.2e}); "
              f"fp8kv mode {worst8:.2e}; greedy reproduced from one forward over prompt+greedy: yes")
        report[v] = dict(max_abs=worst, max_rel=worst_rel, fp8kv_max_abs=worst8)

        # debug intermediates of the debug prompt
        i = man["debug_prompt"]
        rec = {}
        forward(W, ref[f"prompt.{i}.ids"], rec=rec)
        for L in range(mf.NL):
            for k in ("attn_out", "ffn_out", "streams"):
                d = (rec[f"layer{L}.{k}"] - ref[f"debug.layer{L}.{k}"]).abs().max().item()
                assert d < 1e-3, (L, k, d)
            if mf.COMPRESS[L] == 4:
                topk = ref[f"debug.layer{L}.indexer_topk"]
                pick_ref = torch.zeros_like(rec[f"layer{L}.pick"])
                for t in range(topk.shape[0]):
                    for e in topk[t].tolist():
                        if e >= 0:
                            pick_ref[t, e] = True
                assert torch.equal(pick_ref, rec[f"layer{L}.pick"]), L
        print(f"[{v}] debug intermediates and indexer picks of prompt {i} match")

    # Mutations (mxfp4 variant, the two longest prompts): how far each wrong semantics moves the logits
    W = mf.dequantize_from_files(mf.read_checkpoint(os.path.join(fx, "tiny-mxfp4")), "mxfp4")
    ref = load_file(os.path.join(fx, "tiny-mxfp4", "reference.safetensors"))
    n = len(man["prompt_lengths"])
    muts = [("window 17 (p-16..p)", "window", 17), ("window 15 (p-14..p)", "window", 15),
            ("visible w < p//c", "visible_plus1", False), ("CSA without overlap", "csa_overlap", False),
            ("compressed RoPE at last token of window", "comp_pos_first", False), ("no attention sink", "sink", False),
            ("no inverse RoPE on output", "inverse_rope", False), ("mHC comb not transposed", "hc_transpose", False),
            ("shared expert unclamped", "clamp_shared", False), ("routed experts unclamped", "clamp_routed", False),
            ("routing weights from score+bias", "bias_in_weights", True),
            ("RoPE half-split pairs (i, i+32)", "rope_half_split", True), ("no YaRN on compress layers", "yarn_compress", False),
            ("CSA attends all visible entries (no indexer)", "indexer", False),
            ("compressed entries overlapping the window dropped", "comp_skip_window", True)]
    print("mutation: max|dlogit| over all prompts vs the stored fp32 logits")
    report["mutations"] = {}
    for label, attr, val in muts:
        o = Opts()
        setattr(o, attr, val)
        dmax = 0.0
        for i in range(n):
            d = (forward(W, ref[f"prompt.{i}.ids"], o) - ref[f"prompt.{i}.logits"]).abs().max().item()
            dmax = max(dmax, d)
        print(f"  {label:45s} {dmax:.3e}")
        report["mutations"][label] = dmax

    # Transformers' incremental decode (DynamicCache) vs the no-cache full forward
    deq = mf.dequantize_from_files(mf.read_checkpoint(os.path.join(fx, "tiny-mxfp4")), "mxfp4")
    model = mf.build_model(deq)
    ids = torch.cat([ref["prompt.15.ids"], ref["prompt.15.greedy"]])
    with torch.no_grad():
        full = model(input_ids=ids[None], use_cache=False).logits[0]
        for split in (1, 5, 33, 70):
            out = model(input_ids=ids[None, :split], use_cache=True)
            pkv, rows = out.past_key_values, [out.logits[0]]
            for t in range(split, len(ids)):
                o = model(input_ids=ids[None, t:t + 1], past_key_values=pkv, use_cache=True)
                pkv = o.past_key_values
                rows.append(o.logits[0])
            inc = torch.cat(rows)
            d = (inc - full).abs().max().item()
            print(f"transformers cached decode (prefill {split}, then 1 token/step) vs full forward: "
                  f"max|dlogit| {d:.3e}, argmax agree {float((inc.argmax(-1) == full.argmax(-1)).float().mean()):.3f}")
            report[f"cached_decode_prefill_{split}"] = d

    # from_pretrained with transformers' own conversion rules must give the same state dict as our mapping
    with tempfile.TemporaryDirectory() as td:
        save_file({k: t.contiguous() for k, t in deq.items()}, os.path.join(td, "model.safetensors"),
                  metadata={"format": "pt"})
        mf.hf_config().save_pretrained(td)
        from transformers import DeepseekV4ForCausalLM
        m2 = DeepseekV4ForCausalLM.from_pretrained(td, dtype=torch.float32)
        sd1, sd2 = model.state_dict(), m2.state_dict()
        assert set(sd1) == set(sd2)
        bad = [k for k in sd1 if not torch.equal(sd1[k], sd2[k].to(sd1[k].dtype))]
        print(f"from_pretrained(official names) vs our name mapping: {len(sd1)} tensors, {len(bad)} differ {bad[:5]}")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
