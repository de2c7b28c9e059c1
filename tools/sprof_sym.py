#!/usr/bin/env python3
"""tools/sprof_sym.py SAMPLES BINARY NAME [FUNC] - symbolise tools/sprof.c's samples with addr2line: the innermost
frame of NAME (the binary's file name in /proc/self/maps) per sample, inclusive counts, and with FUNC the call
chains of NAME's functions through FUNC."""
import collections
import subprocess
import sys

f, binpath, name = sys.argv[1:4]
func = sys.argv[4] if len(sys.argv) > 4 else None
lines = open(f).read().split("\n")
mi = lines.index("MAPS")
samples = [l.split() for l in lines[:mi] if l.strip()]
maps = []
for l in lines[mi + 1:]:
    p = l.split()
    if len(p) >= 6 and "x" in p[1]:
        a, b = (int(x, 16) for x in p[0].split("-"))
        maps.append((a, b, int(p[2], 16), p[5]))


def mod(addr):
    for a, b, off, path in maps:
        if a <= addr < b:
            return path, addr - a + off
    return None, None


own = {}
for s in samples:
    for x in s[1:]:
        a = int(x, 16)
        p, o = mod(a)
        if p and p.endswith(name):
            own[a] = o
keys = sorted(own)
out = subprocess.run(["addr2line", "-f", "-C", "-e", binpath] + [hex(own[k] - 1) for k in keys],
                     capture_output=True, text=True).stdout.split("\n")
fn = {k: out[2 * i].split("(")[0] for i, k in enumerate(keys)}


def names(s):
    fr = [int(x, 16) for x in s[2:]]  # [1] is the signal handler's frame
    return [fn[a] if a in fn else "[" + (mod(a)[0] or "?").split("/")[-1] + "]" for a in fr]


inner, incl, chains = collections.Counter(), collections.Counter(), collections.Counter()
for s in samples:
    ns = names(s)
    own_ns = [x for x in ns if not x.startswith("[")]
    inner[own_ns[0] if own_ns else ns[0] if ns else "?"] += 1
    for x in set(ns):
        incl[x] += 1
    if func and func in ns:
        chains[" < ".join(own_ns[:6])] += 1
print("samples", len(samples))
print("== innermost frame of", name)
for k, c in inner.most_common(25):
    print(f"{c:6d} {k}")
print("== inclusive")
for k, c in incl.most_common(40):
    print(f"{c:6d} {k}")
if func:
    print("== chains through", func)
    for k, c in chains.most_common(30):
        print(f"{c:6d} {k}")
