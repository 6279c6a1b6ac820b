#!/usr/bin/env python3
"""Writes the tokenizer comparison corpus: 16 000+ strings, one JSON string per line.

Deterministic (fixed seed). Families: many languages and scripts, CJK, emoji and ZWJ sequences,
combining marks, code, numbers of every length, whitespace runs and mixed newlines, every added
token of the given tokenizers inside text, long single words, and random valid-UTF-8 soups, and a sweep over every code point.
"""
import argparse
import json
import random

SENTENCES = [
    "The quick brown fox jumps over the lazy dog. It's 3:45pm, isn't it? I'll be there; we've said so.",
    "Der schnelle braune Fuchs springt über den faulen Hund. Größe, Maß, Straße — „Anführungszeichen“.",
    "Le cœur a ses raisons que la raison ne connaît point. « Déjà vu » à l'hôtel, naïveté, façade.",
    "El veloz murciélago hindú comía feliz cardillo y kiwi. ¿Qué tal? ¡Muy bien! Año, niño, pingüino.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю. Ёлка, объём, подъезд.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Καλημέρα κόσμε! Ἀρχιμήδης, ᾠδή.",
    "我能吞下玻璃而不伤身体。人工智能正在改变世界，深度学习模型需要大量数据。",
    "私はガラスを食べられます。それは私を傷つけません。カタカナとひらがな、漢字を混ぜる。",
    "나는 유리를 먹을 수 있어요. 그래도 아프지 않아요. 한국어 형태소 분석기.",
    "أنا قادر على أكل الزجاج و هذا لا يؤلمني. مرحبا بالعالم! ١٢٣٤٥٦٧٨٩٠",
    "אני יכול לאכול זכוכית וזה לא מזיק לי. שָׁלוֹם עוֹלָם",
    "मैं काँच खा सकता हूँ और मुझे उससे कोई चोट नहीं पहुंचती. नमस्ते दुनिया १२३४",
    "ฉันกินกระจกได้ แต่มันไม่ทำให้ฉันเจ็บ สวัสดีชาวโลก",
    "Tôi có thể ăn thủy tinh mà không hại gì. Tiếng Việt có dấu: ắ ằ ẳ ẵ ặ.",
    "Cam yiyebilirim, bana zararı dokunmaz. İstanbul, ığdır, ŞÇĞÜÖ.",
    "მინას ვჭამ და არა მტკივა. Ես կարող եմ ապակի ուտել և ինձ անհանգիստ չի անում.",
    "ብርጭቆ መብላት እችላለሁ፣ አይጎዳኝም። நான் கண்ணாடி சாப்பிடுவேன், அதனால் எனக்கு ஒரு கேடும் வராது.",
    "আমি কাঁচ খেতে পারি, তাতে আমার কোনো ক্ষতি হয় না। ಕನ್ನಡ ತೆಲುగు മലയാളം ગુજરાતી ਪੰਜਾਬੀ",
    "Mogę jeść szkło i mi nie szkodzi. Příliš žluťoučký kůň úpěl ďábelské ódy. Ärger, Øre, Åland.",
    "ᚠᛇᚻ᛫ᛒᛦᚦ᛫ᚠᚱᚩᚠᚢᚱ᛫ᚠᛁᚱᚪ᛫ᚷᛖᚻᚹᛦᛚᚳᚢᛗ 𐌼𐌰𐌲 𐌲𐌻𐌴𐍃 ᠮᠣᠩᠭᠣᠯ ᠬᠡᠯᠡ ꦧꦱꦗꦮ",
]

CODE = [
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\tfor (auto& x : v) x *= 2;\n\treturn 0;\n}\n",
    "const f = async (x) => { await fetch(`/api/${x}?q=1&r=2`); return x ?? null; };",
    "<html><body class=\"main\"><p id='a'>Hello &amp; welcome</p><!-- comment --></body></html>",
    "{\"name\": \"tern\", \"version\": [0, 1, 0], \"tags\": {\"a\": null, \"b\": true}}",
    "for i in $(seq 1 10); do echo \"$i\" | sed -e 's/1/one/g' >> out.txt 2>&1; done",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC LIMIT 10;",
    "fn main() { let mut s = String::new(); s.push_str(\"héllo\"); println!(\"{s:?}\"); }",
    "    \r\n\t// indented comment with trailing spaces   \n\n\n    x = y  ;;  # note\n",
    "matrix = [[1, 2, 3],\n          [4, 5, 6]]  # shape (2, 3)\nprint(matrix[0][-1])",
]

EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸", "1️⃣", "❤️", "🧑🏿‍💻", "👩‍❤️‍💋‍👨", "🐈‍⬛",
         "🫠", "🦀", "✈︎", "☕", "🤌🏻", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "👁️‍🗨️", "🧔‍♂️", "😶‍🌫️"]

WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n ", "\u00a0", "\u3000", "\u2028", "\u2029",
              "\u180e", "\u200b", "\u2003", "\x0b", "\x0c", "\x85", "\u202f", "\u205f", "\ufeff", "\x1c"]

COMBINING = [chr(c) for c in list(range(0x300, 0x370)) + list(range(0x1AB0, 0x1ABF)) + list(range(0x20D0, 0x20F1))]
DIGIT_SETS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "߀߁߂߃߄߅߆߇߈߉", "①②③④⑤⑥⑦⑧⑨", "ⅠⅡⅢⅣⅤ"]
CJK_RANGES = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x3040, 0x30FF), (0xAC00, 0xD7A3),
              (0xFF01, 0xFF5E), (0x3000, 0x303F), (0x31350, 0x323AF), (0x2EBF0, 0x2EE5D), (0xF900, 0xFAFF)]


def cjk(rng, n):
    out = []
    for _ in range(n):
        lo, hi = rng.choice(CJK_RANGES)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def random_codepoint(rng):
    plane = rng.random()
    if plane < 0.5:
        cp = rng.randint(0x20, 0x2FFF)
    elif plane < 0.8:
        cp = rng.randint(0x3000, 0xFFFF)
    elif plane < 0.95:
        cp = rng.randint(0x10000, 0x3FFFF)
    else:
        cp = rng.randint(0x40000, 0x10FFFF)
    if 0xD800 <= cp <= 0xDFFF:
        cp = 0xFFFD
    return chr(cp)


def soup(rng):
    if rng.random() < 0.5:
        return "".join(random_codepoint(rng) for _ in range(rng.randint(1, 80)))
    raw = bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 120)))
    return raw.decode("utf-8", errors=rng.choice(["replace", "ignore"]))


def number(rng):
    digits = rng.choice(DIGIT_SETS)
    n = rng.randint(1, 64)
    s = "".join(rng.choice(digits) for _ in range(n))
    forms = [s, "-" + s, s + "." + s[: rng.randint(1, 5)], "x" + s + "y", f"{s[:3]},{s[3:6]},{s[6:9]}",
             s + "%", "$" + s, s + "e-" + str(rng.randint(1, 300)), "v" + ".".join(s[:4])]
    return rng.choice(forms)


def mutate(rng, text):
    if not text:
        return text
    a = rng.randint(0, len(text) - 1)
    b = rng.randint(a, min(len(text), a + rng.randint(1, 200)))
    piece = text[a:b]
    r = rng.random()
    if r < 0.2:
        piece = piece.upper()
    elif r < 0.3:
        piece = piece.replace(" ", rng.choice(WHITESPACE))
    return piece


def with_marks(rng, text):
    return "".join(c + "".join(rng.choice(COMBINING) for _ in range(rng.randint(0, 3))) for c in text)


def whitespace_mix(rng):
    parts = []
    for _ in range(rng.randint(1, 12)):
        parts.append(rng.choice(WHITESPACE) * rng.randint(1, 6))
        if rng.random() < 0.6:
            parts.append(rng.choice(["word", "x", "Hello", "世界", "123", "!", "...", "é", "🙂"]))
    return "".join(parts)


def long_word(rng):
    n = rng.choice([50, 200, 1000, 3000, 6000])
    kind = rng.randint(0, 4)
    if kind == 0:
        return rng.choice("abcxyz") * n
    if kind == 1:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))
    if kind == 2:
        return cjk(rng, n // 3)
    if kind == 3:
        return "ab" * (n // 2)
    return " " * n + "x"


def family_samples(rng, added_tokens):
    fams = {
        "language": lambda: mutate(rng, " ".join(rng.sample(SENTENCES, rng.randint(1, 3)))),
        "cjk": lambda: cjk(rng, rng.randint(1, 60)) + rng.choice(["", "。", " abc", "123"]),
        "emoji": lambda: "".join(rng.choice(EMOJI + [" ", "a", "！"]) for _ in range(rng.randint(1, 15))),
        "marks": lambda: with_marks(rng, mutate(rng, rng.choice(SENTENCES))),
        "code": lambda: mutate(rng, "\n".join(rng.sample(CODE, rng.randint(1, 3)))),
        "number": lambda: " ".join(number(rng) for _ in range(rng.randint(1, 4))),
        "whitespace": lambda: whitespace_mix(rng),
        "special": lambda: mutate(rng, rng.choice(SENTENCES)) + rng.choice(["", " ", "\n"]) + rng.choice(added_tokens)
        + rng.choice(["", " ", "x"]) + mutate(rng, rng.choice(SENTENCES + CODE)),
        "soup": lambda: soup(rng),
        "long": lambda: long_word(rng),
    }
    counts = {"language": 2000, "cjk": 1000, "emoji": 800, "marks": 800, "code": 1000, "number": 1500,
              "whitespace": 1200, "special": 600, "soup": 2000, "long": 150}
    for fam, count in counts.items():
        for _ in range(count):
            yield fam, fams[fam]()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--added-tokens", nargs="*", default=[], help="tokenizer.json files whose added tokens to embed")
    ap.add_argument("--seed", type=int, default=20240601)
    args = ap.parse_args()
    added = []
    for path in args.added_tokens:
        with open(path, encoding="utf-8") as f:
            added += [t["content"] for t in json.load(f).get("added_tokens", [])]
    rng = random.Random(args.seed)
    lines = []
    for token in added:  # every added token at least once, inside text
        lines.append("x" + token + "y " + token)
    for _, text in family_samples(rng, added or ["<|endoftext|>"]):
        lines.append(text)
    # Every code point once, 256 at a time, with and without spaces between them.
    for start in range(0, 0x110000, 256):
        cps = [chr(c) for c in range(start, start + 256) if not 0xD800 <= c <= 0xDFFF]
        if cps:
            lines.append(("" if start % 512 else " ").join(cps))
    lines += ["", " ", "\n", "a", "  leading", "trailing  ", "\r\n\r\n", "Hello world"]
    with open(args.out, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    print(len(lines))


if __name__ == "__main__":
    main()
