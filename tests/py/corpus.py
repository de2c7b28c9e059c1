"""Deterministic, varied test text for the tokenizer differential tests.

Every document mixes fragments of several kinds so that boundaries between
scripts, whitespace, digits and control-token strings all get exercised:
English prose and code (from the Python standard library's own sources, which
every test machine has), JSON, Chinese/Japanese, Korean and other scripts,
combining marks, emoji with ZWJ sequences and skin tones, astral-plane
characters, whitespace runs of every Unicode space, digit runs in several
number systems, the tokenizer's own added-token strings (whole and broken),
and uniformly random code points (controls and unassigned ones included).
"""
import json
import os
import random
import sys
import sysconfig

_STDLIB = None


def _stdlib_texts():
    global _STDLIB
    if _STDLIB is None:
        root = sysconfig.get_paths()["stdlib"]
        files = []
        for d, _dirs, names in os.walk(root):
            if "site-packages" in d or "test" in d.split(os.sep):
                continue
            files += [os.path.join(d, n) for n in names if n.endswith((".py", ".txt", ".rst"))]
        files.sort()
        texts = []
        for f in files[:4000]:
            try:
                texts.append(open(f, encoding="utf-8").read())
            except (UnicodeDecodeError, OSError):
                pass
        _STDLIB = [t for t in texts if t]
    return _STDLIB


WS = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", "\u00a0", "\u3000", "\u2028", "\u2029",
      "\x0b", "\x0c", "\x85", "\u2003", "\u202f", "\u205f", "\u1680", " \n ", "\t \n"]
DIGITS = "0123456789" * 4 + "٠١٢٣٤٥٦٧٨٩۰۱۲۳۴۵۶۷۸۹०१२३४५६७८९²³¹½¼⅓ⅠⅡⅢⅣⅫ①②③０１２３"
EMOJI_BASE = [0x1F600, 0x1F64F, 0x1F300, 0x1F5FF, 0x1F900, 0x1F9FF, 0x1FA70, 0x1FAFF]
SCRIPTS = [(0x0400, 0x04FF), (0x0370, 0x03FF), (0x0600, 0x06FF), (0x05D0, 0x05EA), (0x0900, 0x097F),
           (0x0E00, 0x0E7F), (0xAC00, 0xD7A3), (0x1100, 0x11FF), (0x0530, 0x058F), (0x10A0, 0x10FF),
           (0x0300, 0x036F), (0x1E00, 0x1EFF), (0x0080, 0x024F), (0x2000, 0x206F), (0x2100, 0x22FF),
           (0x3000, 0x303F), (0xFF00, 0xFFEF), (0xFE00, 0xFE0F), (0x1D400, 0x1D7FF), (0x20000, 0x2A6DF)]


def _rand_cjk(r, n):
    out = []
    for _ in range(n):
        k = r.random()
        if k < 0.6:
            out.append(chr(r.randint(0x4E00, 0x9FFF)))
        elif k < 0.75:
            out.append(chr(r.randint(0x3040, 0x30FF)))
        elif k < 0.85:
            out.append(r.choice("，。！？、：；「」『』（）《》…—·"))
        elif k < 0.9:
            out.append(chr(r.randint(0x3400, 0x4DBF)))
        else:
            out.append(r.choice(["的", "是", "深度求索", "模型", "テスト", "カタカナ", "日本語", " ", "1", "a"]))
    return "".join(out)


def _rand_emoji(r, n):
    out = []
    for _ in range(n):
        k = r.random()
        a, b = EMOJI_BASE[2 * r.randrange(4)], EMOJI_BASE[2 * r.randrange(4) + 1]
        e = chr(r.randint(min(a, b), max(a, b)))
        if k < 0.2:
            e += chr(r.randint(0x1F3FB, 0x1F3FF))  # skin tone
        elif k < 0.35:
            e += "\u200d" + chr(r.randint(0x1F466, 0x1F469))  # ZWJ
        elif k < 0.45:
            e = chr(r.randint(0x1F1E6, 0x1F1FF)) + chr(r.randint(0x1F1E6, 0x1F1FF))  # flag
        elif k < 0.5:
            e += "\ufe0f"
        out.append(e)
        if r.random() < 0.3:
            out.append(r.choice([" ", "", "!", "a", "\n"]))
    return "".join(out)


def _rand_script(r, n):
    lo, hi = r.choice(SCRIPTS)
    words = []
    for _ in range(n):
        words.append("".join(chr(r.randint(lo, hi)) for _ in range(r.randint(1, 9))))
    return r.choice([" ", "", "\u00a0", "-", "\n"]).join(words)


def _rand_json(r, depth=0):
    k = r.random()
    if depth > 3 or k < 0.3:
        return r.choice([r.randint(-10**12, 10**12), r.random() * 10 ** r.randint(-5, 20), True, None,
                         "".join(chr(r.randint(32, 0x2FFF)) for _ in range(r.randint(0, 12)))])
    if k < 0.65:
        return {("k%d" % i if r.random() < 0.5 else _rand_script(r, 1)): _rand_json(r, depth + 1)
                for i in range(r.randint(0, 5))}
    return [_rand_json(r, depth + 1) for _ in range(r.randint(0, 5))]


def _rand_codepoints(r, n):
    out = []
    for _ in range(n):
        c = r.randint(0, 0x10FFFF) if r.random() < 0.5 else r.randint(0, 0x3000)
        if 0xD800 <= c <= 0xDFFF:
            c = 0xFFFD
        out.append(chr(c))
    return "".join(out)


def fragment(r, added):
    k = r.randrange(11)
    if k in (0, 1):
        t = r.choice(_stdlib_texts())
        a = r.randrange(max(1, len(t)))
        return t[a:a + r.randint(20, 3000)]
    if k == 2:
        return json.dumps(_rand_json(r), ensure_ascii=r.random() < 0.3, indent=r.choice([None, 1, 2]))
    if k == 3:
        return _rand_cjk(r, r.randint(1, 200))
    if k == 4:
        return _rand_emoji(r, r.randint(1, 30))
    if k == 5:
        return _rand_script(r, r.randint(1, 40))
    if k == 6:
        return "".join(r.choice(WS) for _ in range(r.randint(1, 30)))
    if k == 7:
        return "".join(r.choice(DIGITS) for _ in range(r.randint(1, 60)))
    if k == 8:
        tok = r.choice(added)
        if r.random() < 0.3:  # broken control token
            tok = tok[:r.randint(1, len(tok))]
        return r.choice(["", " ", "\n", "x"]) + tok + r.choice(["", " ", "\n", "y"])
    if k == 9:
        return _rand_codepoints(r, r.randint(1, 80))
    return r.choice(["don't", "I'll", " ?!...", "--flag=value", "https://x.io/a?b=c&d=%20", "a_b.c",
                     "'s", "\"quoted\"", "(x)", "#include <x.h>", "    ", "CamelCase", "ALLCAPS"])


def documents(seed, total_bytes, added, max_doc=20000):
    """Yield documents until total_bytes of UTF-8 have been produced."""
    r = random.Random(seed)
    produced = 0
    while produced < total_bytes:
        target = r.choice([50, 500, 2000, 8000, max_doc])
        parts, size = [], 0
        while size < target:
            f = fragment(r, added)
            parts.append(f)
            size += len(f.encode("utf-8"))
        doc = "".join(parts)
        produced += len(doc.encode("utf-8"))
        yield doc


if __name__ == "__main__":
    # write a corpus file: python3 tests/py/corpus.py SEED MB > out.txt
    seed, mb = int(sys.argv[1]), float(sys.argv[2])
    added = ["<｜User｜>", "<think>", "</think>", "<｜end▁of▁sentence｜>", "｜DSML｜"]
    for d in documents(seed, int(mb * 2**20), added):
        sys.stdout.write(d)
