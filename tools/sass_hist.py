#!/usr/bin/env python3
"""sass_hist.py - where a kernel's hot loop spends its instructions, from a cuobjdump SASS listing.

The build machine has no disassembler; the GPU machine has cuobjdump.  In one device call:

    cuobjdump -sass .carry/bin/libdeepinfer_cuda.so > $OUT/all.sass

(or `awk` out the one function first: the whole library is ~500k lines).  Then here:

    python3 tools/sass_hist.py all.sass --kernel 'wg_kernelILi1ELi1E'

For each function whose mangled name matches --kernel, the loop is the backward branch whose body holds the most
matrix instructions (HGMMA / HMMA / IMMA; the smallest such body on a tie), or --range LO:HI (hex addresses).  It
prints the body's instruction count, the count per matrix instruction, and the opcode histogram (--full keeps the
modifiers: LOP3.LUT, IMAD.SHL.U32, ...).  Branch paths inside the body are all counted, taken or not, so a rare
path (an error or special-value branch) counts as if it always ran: --skip LO:HI leaves such a range out.

The fifteenth session found ~35 of wg_kernel's ~298 instructions a chunk this way (docs/BENCHMARKS.md, "The wgmma
experts' instruction budget").
"""
import argparse
import collections
import re
import sys

MMA = ("HGMMA", "HMMA", "IMMA", "QGMMA", "DMMA")
FUNC_RE = re.compile(r"Function\s*:\s*(\S+)")
INS_RE = re.compile(r"^\s*/\*([0-9a-fA-F]{4,})\*/\s+([^;]*);")
BRA_RE = re.compile(r"\bBRA\b(?:\.[A-Z.]+)?\s+(?:[!A-Z0-9]+,\s*)?(0x[0-9a-fA-F]+)")


def parse(text):
    """{function name: [(address, opcode with modifiers, operand text)]}"""
    funcs = collections.OrderedDict()
    cur = None
    for line in text.splitlines():
        m = FUNC_RE.search(line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = INS_RE.match(line)
        if m and cur is not None:
            body = m.group(2).strip()
            toks = body.split()
            if toks and toks[0].startswith("@"):  # predicate
                toks = toks[1:]
            if not toks:
                continue
            cur.append((int(m.group(1), 16), toks[0], " ".join(toks[1:])))
    return funcs


def is_mma(op):
    return op.split(".")[0] in MMA


def find_loop(ins):
    """(lo, hi) of the backward branch body with the most matrix instructions, or None"""
    best = None
    for addr, op, rest in ins:
        if op.split(".")[0] != "BRA":
            continue
        m = BRA_RE.search(op + " " + rest)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target > addr:
            continue
        n = sum(1 for a, o, _ in ins if target <= a <= addr and is_mma(o))
        key = (n, -(addr - target))
        if best is None or key > best[0]:
            best = (key, (target, addr))
    return best[1] if best and best[0][0] > 0 else None


def hist(ins, lo, hi, skips, full):
    c = collections.Counter()
    n = n_mma = 0
    for addr, op, _ in ins:
        if not lo <= addr <= hi or any(s0 <= addr < s1 for s0, s1 in skips):
            continue
        n += 1
        n_mma += is_mma(op)
        c[op if full else op.split(".")[0]] += 1
    return n, n_mma, c


def span(s):
    lo, hi = s.split(":")
    return int(lo, 16), int(hi, 16)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sass", help="cuobjdump -sass output ('-' for stdin)")
    ap.add_argument("--kernel", default=".", help="regex on the mangled function name (default: every function)")
    ap.add_argument("--range", type=span, help="LO:HI hex addresses instead of the detected loop")
    ap.add_argument("--skip", type=span, action="append", default=[], help="LO:HI hex addresses to leave out")
    ap.add_argument("--full", action="store_true", help="opcodes with their modifiers")
    ap.add_argument("--top", type=int, default=25, help="histogram rows (default 25)")
    a = ap.parse_args(argv)
    text = sys.stdin.read() if a.sass == "-" else open(a.sass, encoding="utf-8", errors="replace").read()
    funcs = parse(text)
    rx = re.compile(a.kernel)
    shown = 0
    for name, ins in funcs.items():
        if not rx.search(name) or not ins:
            continue
        shown += 1
        loop = a.range or find_loop(ins)
        if loop is None:
            print(f"{name}: {len(ins)} instructions, no loop with matrix instructions (use --range)")
            continue
        n, n_mma, c = hist(ins, loop[0], loop[1], a.skip, a.full)
        per = f", {n / n_mma:.1f} per matrix instruction" if n_mma else ""
        print(f"{name}: loop 0x{loop[0]:x}..0x{loop[1]:x}: {n} instructions, {n_mma} matrix{per}")
        for op, k in c.most_common(a.top):
            print(f"  {k:6d}  {op}")
    if not shown:
        print(f"no function matches {a.kernel!r} ({len(funcs)} in the listing)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
