#!/usr/bin/env python3
"""Compares tern bench with sglang bench_serving result files (JSON lines, one run per line).

Usage: compare-bench-diff.py TERN.jsonl SGLANG.jsonl [--tolerance 0.05]
Each file may hold several runs (rounds); the mean over rounds is compared. Exits 1 when output
throughput, mean TTFT or mean TPOT differ by more than the tolerance.
"""
import argparse
import json
import statistics

GATED = ["output_throughput", "mean_ttft_ms", "mean_tpot_ms"]
INFO = ["completed", "total_output_tokens", "duration", "request_throughput", "median_ttft_ms", "p99_ttft_ms",
        "median_tpot_ms", "mean_itl_ms", "mean_e2e_latency_ms"]


def load(path):
    runs = [json.loads(line) for line in open(path) if line.strip()]
    return {k: statistics.mean(float(r[k]) for r in runs) for k in GATED + INFO if all(k in r for r in runs)}, runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tern")
    ap.add_argument("sglang")
    ap.add_argument("--tolerance", type=float, default=0.05)
    a = ap.parse_args()
    tern, tern_runs = load(a.tern)
    sg, sg_runs = load(a.sglang)
    print(f"rounds: tern {len(tern_runs)}, sglang {len(sg_runs)} (values are means over rounds)")
    print(f"| metric | tern bench | sglang bench_serving | difference |")
    print(f"|---|---|---|---|")
    worst, ok = 0.0, True
    for key in GATED + INFO:
        if key not in tern or key not in sg:
            continue
        t, s = tern[key], sg[key]
        rel = (t - s) / s if s else 0.0
        gate = key in GATED
        if gate:
            worst = max(worst, abs(rel))
            ok &= abs(rel) <= a.tolerance
        print(f"| {key}{' (gated)' if gate else ''} | {t:.3f} | {s:.3f} | {rel * 100:+.2f}% |")
    for name, runs in (("tern", tern_runs), ("sglang", sg_runs)):
        per_round = ", ".join(f"{r['output_throughput']:.1f}/{r['mean_ttft_ms']:.1f}/{r['mean_tpot_ms']:.2f}" for r in runs)
        print(f"{name} per round (tok/s / TTFT ms / TPOT ms): {per_round}")
    print(f"largest gated difference: {worst * 100:.2f}% (tolerance {a.tolerance * 100:.0f}%): "
          f"{'AGREE' if ok else 'DISAGREE'}")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
