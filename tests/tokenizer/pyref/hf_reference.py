#!/usr/bin/env python3
"""Encodes a corpus (one JSON string per line) and random id sequences with Hugging Face
`tokenizers`, the reference tern must equal.

Writes <out>/<name>.ids.jsonl (ids per corpus line, add_special_tokens=False),
<out>/<name>.normalized.jsonl (each line as the tokenizer's normalizer leaves it) and
<out>/<name>.decode.jsonl ({"ids", "skip_special", "text"} for random id sequences).
"""
import argparse
import json
import os
import random
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--decode-cases", type=int, default=3000)
    args = ap.parse_args()
    try:
        from tokenizers import Tokenizer
    except ImportError:
        print("missing Python package: tokenizers (run scripts/setup-test-deps)", file=sys.stderr)
        sys.exit(77)
    tok = Tokenizer.from_file(args.tokenizer)
    with open(args.corpus, encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f]
    encodings = tok.encode_batch(corpus, add_special_tokens=False)
    with open(os.path.join(args.out, args.name + ".ids.jsonl"), "w") as f:
        for e in encodings:
            f.write(json.dumps(e.ids) + "\n")
    # What decode(encode(s)) must give back: s itself, or s normalized when there is a normalizer.
    with open(os.path.join(args.out, args.name + ".normalized.jsonl"), "w", encoding="utf-8") as f:
        for text in corpus:
            normalized = tok.normalizer.normalize_str(text) if tok.normalizer is not None else text
            f.write(json.dumps(normalized, ensure_ascii=False) + "\n")
    rng = random.Random(7)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    specials = [t for t in tok.get_added_tokens_decoder()]
    with open(os.path.join(args.out, args.name + ".decode.jsonl"), "w", encoding="utf-8") as f:
        for i in range(args.decode_cases):
            ids = [rng.randrange(vocab) if rng.random() < 0.85 else rng.choice(specials) for _ in range(rng.randint(1, 40))]
            if i % 3 == 0:  # byte tokens that split characters
                ids = [rng.randrange(0, 300) for _ in range(rng.randint(1, 12))]
            skip = i % 2 == 1
            text = tok.decode(ids, skip_special_tokens=skip)
            f.write(json.dumps({"ids": ids, "skip_special": skip, "text": text}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
