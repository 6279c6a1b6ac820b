#!/usr/bin/env python3
"""Checks a screenshot of the tern bench HTML report (standard library only).

Usage: png_check.py FILE.png
Fails unless the page is not blank and the plot lines were drawn: enough pixels of the first two
series colours (#1f77b4 blue, #d62728 red) and of dark text.
"""
import struct
import sys
import zlib


def read_png(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), f"unsupported PNG (depth {depth}, colour type {color})"
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride = zlib.decompress(idat), width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1: line[i] = (line[i] + a) & 255
            elif kind == 2: line[i] = (line[i] + b) & 255
            elif kind == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return width, height, channels, rows


def main():
    width, height, channels, rows = read_png(sys.argv[1])
    counts = {"blue": 0, "red": 0, "dark": 0, "non_white": 0}
    targets = {"blue": (31, 119, 180), "red": (214, 39, 40)}
    for line in rows:
        for x in range(0, width * channels, channels):
            r, g, b = line[x], line[x + 1], line[x + 2]
            if r + g + b < 740: counts["non_white"] += 1
            if r + g + b < 150: counts["dark"] += 1
            for name, (tr, tg, tb) in targets.items():
                if abs(r - tr) + abs(g - tg) + abs(b - tb) < 30: counts[name] += 1
    print(f"{width}x{height}: {counts}")
    total = width * height
    ok = counts["non_white"] > total * 0.02 and counts["dark"] > 500 and counts["blue"] > 200 and counts["red"] > 200
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
