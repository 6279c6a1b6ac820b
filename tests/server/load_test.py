#!/usr/bin/env python3
"""Load test: C concurrent streaming clients for D seconds against a `tern serve`.

Each client sends streaming completions back to back (random token prompts, random lengths, logprobs=0 so
every chunk names the tokens it delivers) until the duration ends. Checks: no errors, every token
delivered (tokens seen in chunks == usage.completion_tokens), resident memory of the server flat after
warm-up (growth under 5%). Reports requests/s, tokens/s, ITL percentiles, memory.

  tests/server/load_test.py --spawn build/tools/tern --clients 200 --warmup 30 --duration 120 --json out.json
"""
import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time

import openai


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def percentile(values, q):
    if not values:
        return float("nan")
    v = sorted(values)
    k = (len(v) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


class Stats:
    def __init__(self):
        self.requests = self.tokens = self.prompt_tokens = 0
        self.errors = []
        self.missing = 0  # tokens counted by usage but never delivered
        self.itl = []
        self.ttft = []


async def client_loop(client, model, stats, deadline, rng, max_tokens_range):
    while time.time() < deadline:
        prompt = [rng.randrange(100, 120000) for _ in range(rng.randint(4, 64))]
        max_tokens = rng.randint(*max_tokens_range)
        sent = time.time()
        last = None
        seen = 0
        usage = None
        try:
            stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                                     temperature=0.8, logprobs=0, stream=True,
                                                     stream_options={"include_usage": True})
            async for chunk in stream:
                if chunk.usage:
                    usage = chunk.usage
                for c in chunk.choices:
                    n = len(c.logprobs.tokens) if c.logprobs else 0
                    if n:
                        now = time.time()
                        if last is None:
                            stats.ttft.append(now - sent)
                        else:
                            stats.itl.append((now - last) / n)
                        last = now
                        seen += n
        except Exception as e:  # noqa: BLE001 - every failure is reported
            stats.errors.append(repr(e)[:300])
            continue
        if usage is None or usage.completion_tokens < 1 or usage.completion_tokens > max_tokens:
            stats.errors.append(f"bad usage {usage}")
            continue
        stats.missing += usage.completion_tokens - seen
        stats.requests += 1
        stats.tokens += usage.completion_tokens
        stats.prompt_tokens += usage.prompt_tokens


async def sample_memory(pid, samples, stop):
    while not stop.is_set():
        samples.append((time.time(), rss_bytes(pid)))
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except asyncio.TimeoutError:
            pass


async def run(url, model, pid, clients, duration, warmup, seed, max_tokens_range):
    """Warm-up load for `warmup` seconds, then the measured `duration`. Memory growth compares the peak
    resident memory of the second half of the measured run with the peak under warm-up load (after its
    first third): a leak or fragmentation that grows with requests served shows; the working set of a
    busy step does not."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
    samples, stop = [], asyncio.Event()
    mem = asyncio.create_task(sample_memory(pid, samples, stop)) if pid else None
    warm_start = time.time()
    if warmup > 0:
        await asyncio.gather(*[client_loop(client, model, Stats(), warm_start + warmup, random.Random(-1 - i),
                                           max_tokens_range) for i in range(clients)])
    stats = Stats()
    start = time.time()
    await asyncio.gather(*[client_loop(client, model, stats, start + duration, random.Random(seed + i),
                                       max_tokens_range) for i in range(clients)])
    elapsed = time.time() - start
    await client.close()
    stop.set()
    if mem:
        await mem
    warm = [r for t, r in samples if warm_start + warmup / 3 <= t <= start]
    late = [r for t, r in samples if t >= start + elapsed / 2]
    base, end = (max(warm) if warm else 0), (max(late) if late else 0)
    return {
        "clients": clients, "warmup_s": warmup, "duration_s": round(elapsed, 2), "requests": stats.requests,
        "errors": len(stats.errors), "error_examples": stats.errors[:5], "undelivered_tokens": stats.missing,
        "output_tokens": stats.tokens, "prompt_tokens": stats.prompt_tokens,
        "requests_per_s": round(stats.requests / elapsed, 3), "output_tokens_per_s": round(stats.tokens / elapsed, 2),
        "ttft_p50_s": round(percentile(stats.ttft, 0.5), 4), "ttft_p99_s": round(percentile(stats.ttft, 0.99), 4),
        "itl_p50_s": round(percentile(stats.itl, 0.5), 4), "itl_p90_s": round(percentile(stats.itl, 0.9), 4),
        "itl_p99_s": round(percentile(stats.itl, 0.99), 4),
        "rss_warmup_peak_bytes": base, "rss_late_peak_bytes": end, "rss_end_bytes": samples[-1][1] if samples else 0,
        "rss_growth": round((end - base) / base, 4) if base else None,
    }


def spawn(binary, extra):
    proc = subprocess.Popen([binary, "serve", "--port", "0", *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        sys.stderr.write(line)
        if "ready: serving" in line:
            model = line.split("ready: serving ")[1].split()[0]
            url = line.split(" at ")[1].split()[0]
            return proc, url, model
    raise SystemExit("server exited before it was ready")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spawn", help="tern binary to start (else --url/--model/--pid)")
    ap.add_argument("--serve-args", default="", help="extra tern serve arguments")
    ap.add_argument("--url")
    ap.add_argument("--model")
    ap.add_argument("--pid", type=int, help="server pid, for its memory")
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--duration", type=float, default=120)
    ap.add_argument("--warmup", type=float, default=30, help="seconds of load before measuring")
    ap.add_argument("--max-tokens", default="8,32", help="range of max_tokens per request")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args()
    proc = None
    if a.spawn:
        proc, a.url, a.model = spawn(a.spawn, a.serve_args.split())
        a.pid = proc.pid
    try:
        lo, hi = (int(x) for x in a.max_tokens.split(","))
        result = asyncio.run(run(a.url, a.model, a.pid, a.clients, a.duration, a.warmup, a.seed, (lo, hi)))
    finally:
        if proc:
            proc.terminate()
            proc.wait(60)
    print(json.dumps(result, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    ok = result["errors"] == 0 and result["undelivered_tokens"] == 0 and result["requests"] > 0 and \
        (result["rss_growth"] is None or result["rss_growth"] < 0.05)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
