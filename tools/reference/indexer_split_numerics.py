#!/usr/bin/env python3
"""Host emulation of the numerics of the fused indexer kernel (src/backends/cuda/kernels/indexer_mma.cu).

Why: the kernel's split products (bf16x6: three bf16 planes, six products; fp16x3: two fp16 planes of
power-of-two-scaled rows, three products) are meant to be as accurate as f32. This script measures that on the
host with numpy alone, emulating the tensor cores as exact products summed into an f32 accumulator once per
mma (16 dims), rounded to nearest or toward zero (the hardware's rounding inside an mma is not documented; RZ
is the pessimistic case). It prints, for one query's 64 heads against 2048 keys, the error of each dot product
over sum |q_d k_d| and of the index scores over the row's largest |score|, for the CPU reference's sequential
f32 sums, bf16x6 and fp16x3, and whether the top-512 picks agree with the CPU's.

    python3 tools/reference/indexer_split_numerics.py [--trials N] [--rz]
"""
import argparse

import numpy as np

H, D, S, TOPK = 64, 128, 2048, 512


def f32(x):
    return np.asarray(x, dtype=np.float32)


def bf16(x):
    """Round f32 to bf16 (nearest even), returned as f32."""
    u = f32(x).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def split_bf16x6(x):
    hi = bf16(x)
    r = f32(x - hi)
    mid = bf16(r)
    return [hi, mid, bf16(f32(r - mid))]


def split_fp16x3(x):
    """Rows scaled by the power of two that brings their largest |x| into [2^14, 2^15)."""
    ex = np.floor(np.log2(np.maximum(np.abs(x).max(axis=1, keepdims=True), np.float32(2.0**-100))))
    scale = np.exp2(14 - ex).astype(np.float32)
    xs = f32(x * scale)
    hi = xs.astype(np.float16).astype(np.float32)
    return [hi, f32(xs - hi).astype(np.float16).astype(np.float32)], scale


def to_f32(s64, rz):
    y = s64.astype(np.float32)
    if rz:  # toward zero: step back where nearest rounded away
        away = np.abs(y.astype(np.float64)) > np.abs(s64)
        y = np.where(away, np.nextafter(y, np.float32(0)), y).astype(np.float32)
    return y


def accumulate(a, b, terms, rz):
    """sum over k-steps of 16 dims of the planes' products in `terms`, one f32 rounding per mma."""
    acc = np.zeros((a[0].shape[0], b[0].shape[0]), np.float32)
    for k in range(0, D, 16):
        for ai, bi in terms:
            prod = a[ai][:, k : k + 16].astype(np.float64) @ b[bi][:, k : k + 16].astype(np.float64).T
            acc = to_f32(acc.astype(np.float64) + prod, rz)
    return acc


def score(dots, w):
    # ReLU, dot scale, head weight times heads^-0.5, summed over heads (order matters little next to the errors)
    return (np.maximum(dots, 0) * f32(1 / np.sqrt(D)) * (w * f32(1 / np.sqrt(H)))[None, :]).astype(np.float64).sum(1)


def topk(sc):
    return np.lexsort((np.arange(S), -sc))[:TOPK]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--rz", action="store_true", help="round each mma's sum toward zero instead of to nearest")
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    for _ in range(args.trials):
        q = f32(rng.standard_normal((H, D)))
        k = f32(rng.standard_normal((S, D)))
        w = f32(rng.standard_normal(H))
        exact = k.astype(np.float64) @ q.astype(np.float64).T
        cpu = np.zeros((S, H), np.float32)
        for d in range(D):  # the CPU reference: one f32 multiply-add after another
            cpu = f32(cpu + f32(k[:, d : d + 1] * q[None, :, d]))
        kb, qb = split_bf16x6(k), split_bf16x6(q)
        bf = f32(
            accumulate(kb, qb, [(0, 0)], args.rz)
            + f32(accumulate(kb, qb, [(0, 1), (1, 0)], args.rz) + accumulate(kb, qb, [(1, 1), (0, 2), (2, 0)], args.rz))
        )
        (kh, ks), (qh, qs) = split_fp16x3(k), split_fp16x3(q)
        fp = f32(
            accumulate(kh, qh, [(0, 0)], args.rz)
            + f32(accumulate(kh, qh, [(0, 1)], args.rz) + accumulate(kh, qh, [(1, 0)], args.rz))
        )
        fp = f32(fp / (ks * qs.T))
        se = score(exact, w)
        row_max = np.abs(se).max()
        sum_abs = np.abs(k.astype(np.float64)) @ np.abs(q.astype(np.float64)).T
        ref = topk(score(cpu, w))
        for name, d in (("cpu f32", cpu), ("bf16x6", bf), ("fp16x3", fp)):
            print(
                f"{name:8s} dot err / sum|qk| {np.max(np.abs(d - exact) / sum_abs):.2e}   "
                f"score err / row max {np.max(np.abs(score(d, w) - se)) / row_max:.2e}   "
                f"top-{TOPK} picks differing from the CPU's {int(np.sum(topk(score(d, w)) != ref))}"
            )
        print()


if __name__ == "__main__":
    main()
