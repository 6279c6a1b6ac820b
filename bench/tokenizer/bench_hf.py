#!/usr/bin/env python3
"""Encode throughput of Hugging Face tokenizers on one thread (RAYON_NUM_THREADS=1), same corpus."""
import json
import os
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
from tokenizers import Tokenizer  # noqa: E402


def main():
    tok = Tokenizer.from_file(sys.argv[1])
    corpus = [json.loads(line) for line in open(sys.argv[2], encoding="utf-8")]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
    size = sum(len(s.encode()) for s in corpus)
    for name, run in [("encode_batch", lambda: tok.encode_batch(corpus, add_special_tokens=False)),
                      ("encode loop", lambda: [tok.encode(s, add_special_tokens=False) for s in corpus])]:
        run()  # warm-up
        rounds, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            run()
            rounds += 1
        elapsed = time.perf_counter() - start
        print(f"hf {name}: {rounds * size / elapsed / 1e6:.2f} MB/s ({rounds} rounds)")


if __name__ == "__main__":
    main()
