#!/usr/bin/env python3
"""Compares tern bench with sglang bench_serving result files (JSON lines, one run per line).

Usage: compare-bench-diff.py TERN.jsonl SGLANG.jsonl [--tolerance 0.05] [--server-runs FILE]
Each file holds several rounds; round i of one client ran next to round i of the other. For each
metric it prints every round, each client's mean, standard deviation and coefficient of variation
over its rounds (the noise: the client against itself), the difference of the means, the mean and
standard deviation of the per-round paired differences, and twice the standard error of the
difference of means (what noise alone would give). Exits 1 when output throughput, mean TTFT or mean
TPOT differ by more than the tolerance. --server-runs (written by compare-bench-sglang.py from tern
serve's /metrics) adds the server's own mean step time in each run: when it moves with the clients'
TPOT, the server itself ran at a different speed in that run (the machine), not a client's clock.
"""
import argparse
import json
import math
import statistics

GATED = ["output_throughput", "mean_ttft_ms", "mean_tpot_ms"]
INFO = ["duration", "completed", "total_output_tokens", "request_throughput", "median_ttft_ms", "p99_ttft_ms",
        "median_tpot_ms", "mean_itl_ms", "mean_e2e_latency_ms"]


def load(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def sd(xs):
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def server_runs(path, tern, sg):
    """The server's own mean step time per run, and the gated metrics in units of it (throughput
    times step, TTFT and TPOT over step): what is left of a difference once the server's speed in
    each run is taken out."""
    rows = load(path)
    norm = {}
    for name, client, runs in (("tern", "other", tern), ("sglang", "sglang", sg)):
        step = [r["server_step_ms"] for r in rows if r["client"] == client][:len(runs)]
        print(f"{name:>6} server step ms per round: {'  '.join(f'{x:.2f}' for x in step)}; "
              f"mean {statistics.mean(step):.2f} ± {sd(step):.2f}")
        norm[name] = {"output_throughput × step": [r["output_throughput"] * s for r, s in zip(runs, step)],
                      "mean_ttft_ms / step": [r["mean_ttft_ms"] / s for r, s in zip(runs, step)],
                      "mean_tpot_ms / step": [r["mean_tpot_ms"] / s for r, s in zip(runs, step)]}
    print("| server-speed-normalized metric | tern mean ± sd (cv) | sglang mean ± sd (cv) | difference |")
    print("|---|---|---|---|")
    for key in norm["tern"]:
        t, g = norm["tern"][key], norm["sglang"][key]
        mt, mg = statistics.mean(t), statistics.mean(g)
        print(f"| {key} | {mt:.4f} ± {sd(t):.4f} ({sd(t) / mt * 100:.1f}%) | {mg:.4f} ± {sd(g):.4f} "
              f"({sd(g) / mg * 100:.1f}%) | {(mt - mg) / mg * 100:+.2f}% |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tern")
    ap.add_argument("sglang")
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--server-runs")
    a = ap.parse_args()
    tern, sg = load(a.tern), load(a.sglang)
    n = min(len(tern), len(sg))
    tern, sg = tern[:n], sg[:n]
    print(f"rounds: {n} per client (round i of each client ran back to back)")
    for name, runs in (("tern", tern), ("sglang", sg)):
        rounds = "  ".join(f"{r['output_throughput']:.1f}/{r['mean_ttft_ms']:.1f}/{r['mean_tpot_ms']:.2f}" for r in runs)
        print(f"{name:>6} per round (tok/s / TTFT ms / TPOT ms): {rounds}")
    print("| metric | tern mean ± sd (cv) | sglang mean ± sd (cv) | difference of means | paired difference "
          "mean ± sd | 2·SE (noise) |")
    print("|---|---|---|---|---|---|")
    worst, ok, within_noise = 0.0, True, True
    for key in GATED + INFO:
        if not all(key in r for r in tern + sg):
            continue
        t = [float(r[key]) for r in tern]
        s = [float(r[key]) for r in sg]
        mt, ms = statistics.mean(t), statistics.mean(s)
        rel = (mt - ms) / ms if ms else 0.0
        paired = [(x - y) / y for x, y in zip(t, s) if y]
        se2 = 2 * math.sqrt(sd(t) ** 2 / n + sd(s) ** 2 / n) / ms if ms else 0.0
        gate = key in GATED
        if gate:
            worst = max(worst, abs(rel))
            ok &= abs(rel) <= a.tolerance
            within_noise &= abs(rel) <= se2
        cv = lambda xs, m: sd(xs) / m * 100 if m else 0.0  # noqa: E731
        print(f"| {key}{' (gated)' if gate else ''} | {mt:.3f} ± {sd(t):.3f} ({cv(t, mt):.1f}%) | "
              f"{ms:.3f} ± {sd(s):.3f} ({cv(s, ms):.1f}%) | {rel * 100:+.2f}% | "
              f"{statistics.mean(paired) * 100:+.2f}% ± {sd(paired) * 100:.2f}% | {se2 * 100:.2f}% |")
    if a.server_runs:
        server_runs(a.server_runs, tern, sg)
    print(f"largest gated difference: {worst * 100:.2f}% (tolerance {a.tolerance * 100:.0f}%): "
          f"{'AGREE' if ok else 'DISAGREE'}; "
          f"{'every gated difference is within 2 standard errors of the rounds (noise)' if within_noise else 'some gated difference exceeds 2 standard errors of the rounds'}")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
