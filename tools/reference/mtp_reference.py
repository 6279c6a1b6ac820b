"""Independent fp32 PyTorch reference of the DeepSeek-V4 MTP layer (mtp.0), written from the official structure
(../shared/design/v4-speculative.md section 1, deepseek-v4.md section 2) without any transformers module:
transformers drops mtp.* on load and has no MTP module.

Row p of a sequence has the trunk's 4-stream hidden before hc_head, h_p [hc, D], and the token x_{p+1}:

    e      = e_proj(enorm(embed(x_{p+1})))                  one vector, added to every stream
    X_k    = e + h_proj(hnorm(h_p[k]))                       per stream k (summed, not concatenated)
    X'     = V4 block: hc_pre -> attn_norm -> sliding-window attention (compress ratio 0, theta-10000 RoPE, window
             positions p-window+1 .. p of the MTP layer's own rows, sink) -> hc_post, then hc_pre -> ffn_norm ->
             score-routed MoE (sqrt(softplus), top-k of score + bias, clamped SwiGLU, shared expert) -> hc_post
    logits = head(norm(hc_head_mtp(X')))                     predicts x_{p+2}

Weights are a dict of fp32 tensors under official names ("mtp.0.*", plus the shared "embed.weight" and
"head.weight"). Everything here is a full (no-cache) forward over positions 0..T-1: causal, so a longer sequence
gives the same rows for its first T positions (chained drafting appends rows).
"""

import math

import torch
import torch.nn.functional as F

P = "mtp.0."


class Cfg:
    def __init__(self, **kw):
        # sizes of the tiny fixture model (make_fixtures.py passes its own)
        self.D, self.NH, self.HD, self.ROPE, self.QR, self.OG, self.OR = 256, 4, 256, 64, 128, 2, 64
        self.NE, self.TOPK_E, self.HC, self.WINDOW = 8, 2, 4, 16
        self.ROUTED_SCALE, self.SWIGLU_LIMIT, self.EPS, self.HC_EPS, self.SINKHORN = 1.5, 10.0, 1e-6, 1e-6, 20
        self.ROPE_THETA = 10000.0
        self.__dict__.update(kw)


def rmsnorm(x, w=None, eps=1e-6):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def inv_freq(cfg):
    return 1.0 / (cfg.ROPE_THETA ** (torch.arange(0, cfg.ROPE, 2, dtype=torch.float32) / cfg.ROPE))


def rope(x, pos, freq, inverse=False):
    """Interleaved pairs (2i, 2i+1) of the last len(freq)*2 dims of x [..., T, d] at positions pos [T]."""
    r = 2 * freq.numel()
    ang = pos.float()[:, None] * freq[None, :]
    cos, sin = ang.cos(), ang.sin()
    if inverse:
        sin = -sin
    shape = [1] * (x.dim() - 2) + list(cos.shape)
    cos, sin = cos.view(shape), sin.view(shape)
    a, b = x[..., -r::2], x[..., -r + 1::2]
    out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    return torch.cat([x[..., :-r], out], dim=-1)


def attention(h, W, cfg):
    """Sliding-window-only V4 attention of the MTP block over positions 0..T-1. h [T, D] -> [T, D]."""
    T = h.shape[0]
    a = P + "attn."
    pos = torch.arange(T)
    freq = inv_freq(cfg)
    cq = rmsnorm(h @ W[a + "wq_a.weight"].T, W[a + "q_norm.weight"], cfg.EPS)
    q = (cq @ W[a + "wq_b.weight"].T).view(T, cfg.NH, cfg.HD).transpose(0, 1)  # [NH, T, HD]
    q = rope(rmsnorm(q, None, cfg.EPS), pos, freq)
    kv = rope(rmsnorm(h @ W[a + "wkv.weight"].T, W[a + "kv_norm.weight"], cfg.EPS), pos, freq)  # [T, HD]: K = V
    j = pos[None, :]
    p = pos[:, None]
    visible = (j <= p) & (j > p - cfg.WINDOW)  # the window: p-window+1 .. p
    s = torch.einsum("htd,jd->htj", q, kv) * cfg.HD ** -0.5
    s = s.masked_fill(~visible[None], float("-inf"))
    sink = W[a + "attn_sink"][:, None, None]
    mx = torch.maximum(s.amax(-1, keepdim=True), sink)
    e = torch.exp(s - mx)
    o = (e / (e.sum(-1, keepdim=True) + torch.exp(sink - mx))) @ kv  # [NH, T, HD]
    o = rope(o, pos, freq, inverse=True).transpose(0, 1)  # [T, NH, HD]
    hpg = cfg.NH // cfg.OG
    wo_a = W[a + "wo_a.weight"].view(cfg.OG, cfg.OR, hpg * cfg.HD)
    grp = torch.stack([o[:, g * hpg:(g + 1) * hpg].reshape(T, -1) @ wo_a[g].T for g in range(cfg.OG)], 1)
    return grp.reshape(T, -1) @ W[a + "wo_b.weight"].T


def swiglu(x, w1, w2, w3, limit):
    gate, up = (x @ w1.T).clamp(max=limit), (x @ w3.T).clamp(-limit, limit)
    return (F.silu(gate) * up) @ w2.T


def moe(h, W, cfg, gaps=None):
    """Score-routed MoE (the MTP layer's id is past the hash layers). h [T, D] -> [T, D]."""
    f = P + "ffn."
    s = torch.sqrt(F.softplus(h @ W[f + "gate.weight"].T))  # [T, NE]
    sel = s + W[f + "gate.bias"]
    idx = sel.topk(cfg.TOPK_E, dim=-1).indices
    if gaps is not None:  # k-th minus (k+1)-th selection score: how close the routing is to a flip
        top = sel.sort(dim=-1, descending=True).values
        gaps.append((top[:, cfg.TOPK_E - 1] - top[:, cfg.TOPK_E]).min().item())
    wts = s.gather(1, idx)
    wts = wts / wts.sum(-1, keepdim=True) * cfg.ROUTED_SCALE
    y = torch.zeros_like(h)
    for t in range(h.shape[0]):
        for k in range(cfg.TOPK_E):
            ex = f + f"experts.{int(idx[t, k])}."
            y[t] += wts[t, k] * swiglu(h[t:t + 1], W[ex + "w1.weight"], W[ex + "w2.weight"], W[ex + "w3.weight"],
                                       cfg.SWIGLU_LIMIT)[0]
    sh = f + "shared_experts."
    return y + swiglu(h, W[sh + "w1.weight"], W[sh + "w2.weight"], W[sh + "w3.weight"], cfg.SWIGLU_LIMIT)


def hc_site(X, W, site, norm_w, sub, cfg):
    """One sub-layer inside its hyper-connection. X [T, hc, D]."""
    T, H = X.shape[0], cfg.HC
    f = X.reshape(T, -1)
    m = (f @ W[site + "_fn"].T) * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + cfg.EPS)
    base, scale = W[site + "_base"], W[site + "_scale"]
    pre = torch.sigmoid(m[:, :H] * scale[0] + base[:H]) + cfg.HC_EPS
    post = 2 * torch.sigmoid(m[:, H:2 * H] * scale[1] + base[H:2 * H])
    C = torch.softmax(m[:, 2 * H:].view(T, H, H) * scale[2] + base[2 * H:].view(H, H), dim=-1) + cfg.HC_EPS
    C = C / (C.sum(-2, keepdim=True) + cfg.HC_EPS)
    for _ in range(cfg.SINKHORN - 1):
        C = C / (C.sum(-1, keepdim=True) + cfg.HC_EPS)
        C = C / (C.sum(-2, keepdim=True) + cfg.HC_EPS)
    a = sub(rmsnorm((pre[..., None] * X).sum(1), norm_w, cfg.EPS))
    return post[..., None] * a[:, None, :] + torch.einsum("tjk,tjd->tkd", C, X)  # X'_k = post_k a + sum_j C_jk X_j


def hc_head(X, W, cfg):
    T = X.shape[0]
    f = X.reshape(T, -1)
    m = (f @ W[P + "hc_head_fn"].T) * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + cfg.EPS)
    pre = torch.sigmoid(m * W[P + "hc_head_scale"] + W[P + "hc_head_base"]) + cfg.HC_EPS
    return (pre[..., None] * X).sum(1)


@torch.no_grad()
def mtp_forward(W, hidden, next_ids, cfg, gaps=None):
    """hidden f32 [T, hc, D] (row p: the trunk's pre-hc_head streams of position p, or a chained step's MTP
    output), next_ids int64 [T] (row p: the token at p + 1). Returns (logits [T, vocab] predicting the tokens at
    p + 2, the block's output streams [T, hc, D])."""
    e = rmsnorm(W["embed.weight"][next_ids], W[P + "enorm.weight"], cfg.EPS) @ W[P + "e_proj.weight"].T  # [T, D]
    X = e[:, None, :] + rmsnorm(hidden, W[P + "hnorm.weight"], cfg.EPS) @ W[P + "h_proj.weight"].T  # [T, hc, D]
    X = hc_site(X, W, P + "hc_attn", W[P + "attn_norm.weight"], lambda h: attention(h, W, cfg), cfg)
    X = hc_site(X, W, P + "hc_ffn", W[P + "ffn_norm.weight"], lambda h: moe(h, W, cfg, gaps), cfg)
    y = rmsnorm(hc_head(X, W, cfg), W[P + "norm.weight"], cfg.EPS)
    return y @ W["head.weight"].T, X


@torch.no_grad()
def chain(W, hidden, next_ids, steps, cfg, gaps=None):
    """Teacher-forced rows for positions 0..T-1, then greedy chained drafting from the last one: step 1 is row
    T-1 (the trunk's hidden of the last position and next_ids[T-1]); step k > 1 sits at position T+k-2, takes
    step k-1's output streams as its hidden and step k-1's argmax as its token. Returns (teacher-forced logits
    [T, V], the chain's tokens [steps] (next_ids[T-1], then each step's argmax but the last's), the chain's
    logits [steps, V], the chain's top1-top2 margins)."""
    logits, out = mtp_forward(W, hidden, next_ids, cfg, gaps)
    T = hidden.shape[0]
    toks, rows, margins = [int(next_ids[-1])], [logits[T - 1]], []
    h, ids = hidden, next_ids
    for k in range(1, steps):
        top2 = rows[-1].topk(2).values
        margins.append((top2[0] - top2[1]).item())
        d = int(rows[-1].argmax())
        h = torch.cat([h, out[-1:]])
        ids = torch.cat([ids, torch.tensor([d], dtype=torch.int64)])
        lg, out = mtp_forward(W, h, ids, cfg, gaps)
        toks.append(d)
        rows.append(lg[-1])
    top2 = rows[-1].topk(2).values
    margins.append((top2[0] - top2[1]).item())
    return logits, torch.tensor(toks, dtype=torch.int64), torch.stack(rows).contiguous(), margins
