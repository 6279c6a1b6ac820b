#!/usr/bin/env python3
"""Load test of PD serving: C concurrent streaming clients for D seconds through `tern route` in front of a
prefill and a decode server (spawned here with the embedded tiny model, or given by URL).

The clients are tests/server/load_test.py's (streaming completions back to back, random token prompts,
logprobs so every chunk names its tokens). Checks: no errors, every token delivered, resident memory of
the router, the prefill and the decode server flat after warm-up (growth under 5%, or under 4 MB for a
process that small), no transfer failures, no state memory left when idle. Prints and writes JSON.

  tests/router/pd_load_test.py --spawn build/tools/tern --clients 500 --warmup 30 --duration 120 --json out.json
"""
import argparse
import asyncio
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "server"))
sys.path.insert(0, HERE)

import openai  # noqa: E402
from load_test import Stats, client_loop, percentile  # noqa: E402  (tests/server/load_test.py)
from cluster import metric, rss_bytes, wait_for  # noqa: E402


async def sample_memory(pids, samples, stop):
    while not stop.is_set():
        samples.append((time.time(), {name: rss_bytes(pid) for name, pid in pids.items()}))
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except asyncio.TimeoutError:
            pass


async def run(url, model, pids, clients, duration, warmup, seed, max_tokens_range):
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=900)
    samples, stop = [], asyncio.Event()
    mem = asyncio.create_task(sample_memory(pids, samples, stop))
    warm_start = time.time()
    if warmup > 0:
        warm = Stats()
        await asyncio.gather(*[client_loop(client, model, warm, warm_start + warmup, __import__("random").Random(-1 - i),
                                           max_tokens_range) for i in range(clients)])
    stats = Stats()
    start = time.time()
    await asyncio.gather(*[client_loop(client, model, stats, start + duration, __import__("random").Random(seed + i),
                                       max_tokens_range) for i in range(clients)])
    elapsed = time.time() - start
    await client.close()
    stop.set()
    await mem
    memory = {}
    for name in pids:
        warm = [s[name] for t, s in samples if warm_start + warmup / 3 <= t <= start]
        late = [s[name] for t, s in samples if t >= start + elapsed / 2]
        base, end = (max(warm) if warm else 0), (max(late) if late else 0)
        memory[name] = {"warmup_peak_bytes": base, "late_peak_bytes": end,
                        "growth": round((end - base) / base, 4) if base else None}
    return {
        "clients": clients, "warmup_s": warmup, "duration_s": round(elapsed, 2), "requests": stats.requests,
        "errors": len(stats.errors), "error_examples": stats.errors[:5], "undelivered_tokens": stats.missing,
        "output_tokens": stats.tokens, "prompt_tokens": stats.prompt_tokens,
        "requests_per_s": round(stats.requests / elapsed, 3), "output_tokens_per_s": round(stats.tokens / elapsed, 2),
        "ttft_p50_s": round(percentile(stats.ttft, 0.5), 4), "ttft_p99_s": round(percentile(stats.ttft, 0.99), 4),
        "itl_p50_s": round(percentile(stats.itl, 0.5), 4), "itl_p99_s": round(percentile(stats.itl, 0.99), 4),
        "memory": memory,
    }


def flat(m):
    grown = m["late_peak_bytes"] - m["warmup_peak_bytes"]
    return m["growth"] is None or m["growth"] < 0.05 or grown < (4 << 20)


def check(result, urls):
    """Adds the servers' transfer counters and idle state to the result; returns the list of problems."""
    problems = []
    if result["errors"]:
        problems.append(f"{result['errors']} errors: {result['error_examples']}")
    if result["undelivered_tokens"]:
        problems.append(f"{result['undelivered_tokens']} tokens counted but not delivered")
    if result["requests"] == 0:
        problems.append("no request finished")
    for name, m in result["memory"].items():
        if not flat(m):
            problems.append(f"{name} memory grew {m}")
    p, d = urls["prefill"], urls["decode"]
    result["transfers"] = metric(d, "pd_transfers_total")
    result["transfer_failures"] = metric(d, "pd_transfers_failed_total") + metric(p, "pd_transfers_failed_total")
    result["transfer_bytes"] = metric(d, "pd_transfer_bytes_total")
    if result["transfer_failures"]:
        problems.append(f"{result['transfer_failures']} transfers failed")
    idle = wait_for(lambda: metric(d, "state_memory_used_bytes") == 0 and metric(p, "state_memory_used_bytes") == 0
                    and metric(d, "pd_transfers_in_progress") == 0, timeout=30)
    if not idle:
        problems.append("state memory still in use after the load")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spawn", help="tern binary: start a prefill, a decode server and a router")
    ap.add_argument("--serve-args", default="--max-model-len 1024", help="extra tern serve arguments")
    ap.add_argument("--router", help="router URL (else --spawn)")
    ap.add_argument("--prefill", help="prefill server URL (with --router)")
    ap.add_argument("--decode", help="decode server URL (with --router)")
    ap.add_argument("--clients", type=int, default=500)
    ap.add_argument("--duration", type=float, default=120)
    ap.add_argument("--warmup", type=float, default=30)
    ap.add_argument("--max-tokens", default="8,32")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args()
    procs = []
    try:
        if a.spawn:
            os.environ["TERN_BIN"] = a.spawn
            import cluster
            cluster.TERN_BIN = a.spawn
            extra = a.serve_args.split()
            p, d = cluster.serve("prefill", *extra, wait=False), cluster.serve("decode", *extra, wait=False)
            procs += [p, d]
            p.wait_ready()
            d.wait_ready()
            r = cluster.route("--prefill", p.url, "--decode", d.url)
            procs.append(r)
            urls = {"router": r.url, "prefill": p.url, "decode": d.url}
            pids = {"router": r.proc.pid, "prefill": p.proc.pid, "decode": d.proc.pid}
            model = r.model
        else:
            urls = {"router": a.router, "prefill": a.prefill, "decode": a.decode}
            pids = {}
            model = openai.OpenAI(base_url=a.router + "/v1", api_key="x").models.list().data[0].id
        lo, hi = (int(x) for x in a.max_tokens.split(","))
        result = asyncio.run(run(urls["router"], model, pids, a.clients, a.duration, a.warmup, a.seed, (lo, hi)))
        problems = check(result, urls)
        result["router_retries"] = metric(urls["router"], "router_retries_total")
    finally:
        for proc in reversed(procs):
            proc.stop()
    result["problems"] = problems
    print(json.dumps(result, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
