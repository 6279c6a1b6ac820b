#!/usr/bin/env python3
"""Writes the ShareGPT-format file both clients of scripts/compare-bench read: N prompts of exactly
the same token count under the given tokenizer.json (Hugging Face `tokenizers`), each distinct
(so no prefix can be shared), so the order in which a client sends them cannot matter.

Usage: compare-bench-prompts.py OUT.json TOKENIZER.json --num N --tokens T
"""
import argparse
import json
import random

from tokenizers import Tokenizer

WORDS = ("the a of to and in server token model latency stream request batch cache memory kernel time "
         "first output input queue graph").split()


def exact_prompt(tok, rng, i, tokens):
    """Adds random words until the text has `tokens` tokens; a word that overshoots is dropped."""
    text, tries = f"Request {i}:", 0
    while True:
        n = len(tok.encode(text, add_special_tokens=False).ids)
        if n == tokens:
            return text
        candidate = text + " " + rng.choice(WORDS)
        if len(tok.encode(candidate, add_special_tokens=False).ids) <= tokens:
            text = candidate
        tries += 1
        if tries > 100 * tokens:
            raise SystemExit(f"compare-bench-prompts: cannot reach {tokens} tokens exactly")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("tokenizer")
    ap.add_argument("--num", type=int, required=True)
    ap.add_argument("--tokens", type=int, required=True)
    a = ap.parse_args()
    tok, rng = Tokenizer.from_file(a.tokenizer), random.Random(7)
    prompts = [exact_prompt(tok, rng, i, a.tokens) for i in range(a.num)]
    lengths = {len(tok.encode(p, add_special_tokens=False).ids) for p in prompts}
    assert lengths == {a.tokens}, lengths
    rows = [{"conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": "ok " * 8}]} for p in prompts]
    with open(a.out, "w") as f:
        json.dump(rows, f)
    print(f"prompts: {a.num}, each exactly {a.tokens} tokens (tokenizer {a.tokenizer})")


if __name__ == "__main__":
    main()
