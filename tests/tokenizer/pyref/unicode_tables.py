#!/usr/bin/env python3
"""Derives the Unicode data tern must patch to split text exactly as Hugging Face tokenizers does.

Hugging Face's Oniguruma is newer (Unicode 16.0) than utf8proc (15.0); its normalizer tables are
older. This script asks the installed `tokenizers` about every code point and prints the general
category major classes (L M N P S Z, and Nd) where utf8proc differs, as C++ ranges for
src/tokenizer/unicode_data.cpp. Run it after upgrading tokenizers or libutf8proc.
"""
import ctypes
import ctypes.util

from tokenizers import Regex, pre_tokenizers

CLASSES = ["L", "M", "N", "P", "S", "Z", "Nd"]


def hf_members(prop, cps):
    """The code points of `cps` that Oniguruma's \\p{prop} matches: those a "removed" split drops."""
    split = pre_tokenizers.Split(Regex(r"\p{%s}" % prop), behavior="removed")
    kept = set()
    for _, (start, end) in split.pre_tokenize_str("".join(chr(c) for c in cps)):
        kept.update(range(start, end))
    return {c for i, c in enumerate(cps) if i not in kept}


def utf8proc_category():
    lib = ctypes.CDLL(ctypes.util.find_library("utf8proc") or "libutf8proc.so.2")
    lib.utf8proc_category_string.restype = ctypes.c_char_p
    return lambda cp: lib.utf8proc_category_string(cp).decode()


def main():
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    cat = utf8proc_category()
    ours = {c: cat(c) for c in cps}
    rows = []
    for prop in CLASSES:
        chunk = 4096
        hf = set()
        for i in range(0, len(cps), chunk):
            hf |= hf_members(prop, cps[i : i + chunk])
        mine = {c for c in cps if (ours[c] == prop if len(prop) == 2 else ours[c][0] == prop)}
        for c in sorted(hf - mine):
            rows.append((c, prop))
    ranges = []
    for c, prop in sorted(rows, key=lambda r: (r[1], r[0])):
        if ranges and ranges[-1][2] == prop and ranges[-1][1] + 1 == c:
            ranges[-1][1] = c
        else:
            ranges.append([c, c, prop])
    for first, last, prop in ranges:
        print('    {0x%X, 0x%X, "%s"},' % (first, last, prop))


if __name__ == "__main__":
    main()
