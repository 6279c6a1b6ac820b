#!/usr/bin/env python3
"""Finds each prompt's first acceptable draw for make_fixtures.py in parallel (a machine with many cores).

Runs WORKERS processes per prompt, worker k scanning attempts k, k+WORKERS, ...; the smallest acceptable
attempt over the workers is the one a serial search finds, provided every worker scanned all of its
attempts below it (checked). Prints the --start-attempts list for make_fixtures.py, which then verifies
and writes the fixtures in one serial pass.

    python3 tools/reference/search_draws.py --prompts 12,13,14,15 --workers 4 [--known 4,0,0,...] [--timeout 900]
"""
import argparse
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", required=True, help="comma-separated prompt indices to search")
    ap.add_argument("--workers", type=int, default=4, help="processes per prompt")
    ap.add_argument("--known", default="", help="start attempts already known for the other prompts")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()
    prompts = [int(p) for p in args.prompts.split(",")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = {}
    for p in prompts:
        for k in range(args.workers):
            cmd = [sys.executable, "-u", os.path.join(HERE, "make_fixtures.py"), "--out", f"/tmp/search-{p}-{k}",
                   "--search", str(p), "--stride", str(args.workers), "--offset", str(k)]
            procs[(p, k)] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.time() + args.timeout
    scanned = {key: -1 for key in procs}
    found = {}
    logs = {key: [] for key in procs}
    import selectors
    sel = selectors.DefaultSelector()
    for key, pr in procs.items():
        sel.register(pr.stdout, selectors.EVENT_READ, key)
    open_streams = len(procs)
    while open_streams and time.time() < deadline:
        for sk, _ in sel.select(timeout=1.0):
            key = sk.data
            line = sk.fileobj.readline()
            if not line:
                sel.unregister(sk.fileobj)
                open_streams -= 1
                continue
            logs[key].append(line)
            m = re.match(r"SCANNING prompt \d+ attempt (\d+)", line)
            if m:
                scanned[key] = int(m.group(1))
            m = re.match(r"SEARCH prompt \d+ first acceptable attempt (\d+)", line)
            if m:
                found[key] = int(m.group(1))
        # Done once every prompt's best accept is proven first (each worker found one or scanned past it).
        def settled(p):
            acc = [found[(p, k)] for k in range(args.workers) if (p, k) in found]
            return bool(acc) and all((p, k) in found or scanned[(p, k)] >= min(acc) for k in range(args.workers))
        if all(settled(p) for p in prompts):
            break
    for pr in procs.values():
        if pr.poll() is None:
            pr.kill()
    result = {}
    for p in prompts:
        accepts = [found[(p, k)] for k in range(args.workers) if (p, k) in found]
        if not accepts:
            print(f"prompt {p}: no acceptable draw found within the timeout "
                  f"(scanned up to {max(scanned[(p, k)] for k in range(args.workers))})", file=sys.stderr)
            continue
        best = min(accepts)
        # Every worker must have scanned (and rejected) all its attempts below `best`.
        ok = all((p, k) in found or scanned[(p, k)] >= best for k in range(args.workers))
        print(f"prompt {p}: first acceptable attempt {best}{'' if ok else ' (NOT proven first: a worker stopped early)'}")
        result[p] = best
    known = [int(a) for a in args.known.split(",")] if args.known else []
    n = max(list(result) + [len(known) - 1]) + 1
    starts = [result.get(i, known[i] if i < len(known) else 0) for i in range(n)]
    print("--start-attempts " + ",".join(map(str, starts)))


if __name__ == "__main__":
    main()
