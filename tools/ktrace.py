#!/usr/bin/env python3
"""Read a kernel timeline written by tools/ktrace.c and say what the profiled step's length is made of.

    python3 tools/ktrace.py t.csv [--chain] [--streams]

The critical chain is walked back from the record that ends last: a record's predecessor is the latest-ending of
(a) the record before it on its own stream and (b) the records of other streams that ended before it started (an
event wait). Each record on the chain is charged its end minus its predecessor's end: the time by which it made the
step longer. A kernel under programmatic dependent launch starts before its predecessor ends, so its own span (end
minus start) overstates its work; the charge does not. Summed by kernel, the charges add up to the chain's span.
"""
import argparse
import bisect
import collections
import csv
import re
import shutil
import subprocess
import sys


def itanium_name(m):
    """The innermost name of an Itanium-mangled symbol (_Z3fooPf -> foo, _ZN2ns3fooEv -> foo), or m itself."""
    if not m.startswith("_Z"):
        return m
    i = 3 if m.startswith("_ZN") else 2
    last = None
    while i < len(m) and m[i].isdigit():
        j = i
        while j < len(m) and m[j].isdigit():
            j += 1
        n = int(m[i:j])
        last = m[j : j + n]
        i = j + n
        if m.startswith("_ZN") is False:
            break
    return last or m


def short_names(mangled):
    """Demangled names cut to the function's own name (no namespace, template or arguments)."""
    out = {}
    names = sorted(set(mangled))
    demangled = names
    if shutil.which("c++filt"):
        try:
            r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, timeout=30)
            lines = r.stdout.split("\n")
            if len(lines) >= len(names):
                demangled = lines[: len(names)]
        except (OSError, subprocess.SubprocessError):
            pass
    for m, d in zip(names, demangled):
        s = d
        if s.startswith("void "):
            s = s[5:]
        s = re.split(r"[<(]", s, maxsplit=1)[0]
        s = s.rsplit("::", 1)[-1].strip()
        if not s or s.startswith("_Z"):
            s = itanium_name(m)
        out[m] = s or m
    return out


def load(path, api=False):
    """The listing's records (host API calls only where api)."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            try:
                rows.append({"kind": r["kind"], "stream": int(r["stream"]), "start": int(r["start_ns"]),
                             "end": int(r["end_ns"]), "name": r["name"]})
            except (KeyError, ValueError) as e:
                raise SystemExit(f"{path}: not a ktrace listing ({e})")
    if not rows:
        raise SystemExit(f"{path}: no records")
    if not api:
        rows = [r for r in rows if r["kind"] != "R"]
    short = short_names([r["name"] for r in rows])
    for r in rows:
        r["short"] = short[r["name"]] if r["kind"] == "K" else r["name"].split(",")[0]
    rows.sort(key=lambda r: (r["start"], r["end"]))
    return rows


def chain(rows):
    """The critical chain, last record first: (index, predecessor index or None)."""
    by_stream = collections.defaultdict(list)
    for i, r in enumerate(rows):
        by_stream[r["stream"]].append(i)
    prev_same = {}
    for idx in by_stream.values():
        for a, b in zip(idx, idx[1:]):
            prev_same[b] = a
    ends = sorted(range(len(rows)), key=lambda i: rows[i]["end"])
    end_vals = [rows[i]["end"] for i in ends]
    cur = ends[-1]
    out = []
    seen = set()
    while cur is not None and cur not in seen:
        seen.add(cur)
        r = rows[cur]
        best = prev_same.get(cur)
        # the latest-ending record of another stream that ended before this one started
        k = bisect.bisect_right(end_vals, r["start"]) - 1
        while k >= 0 and rows[ends[k]]["stream"] == r["stream"]:
            k -= 1
        if k >= 0 and (best is None or rows[ends[k]]["end"] > rows[best]["end"]):
            best = ends[k]
        out.append((cur, best))
        cur = best
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--chain", action="store_true", help="print the chain record by record")
    ap.add_argument("--top", type=int, default=30, help="rows of the by-kernel table (default 30)")
    ap.add_argument("--window", metavar="A:B", help="also list every record (host API calls too) starting in [A, B] us")
    ap.add_argument("--gaps", type=int, default=0, metavar="N",
                    help="also list the N longest gaps with nothing running")
    a = ap.parse_args(argv)
    if a.window:
        lo, hi = (float(v) for v in a.window.split(":"))
        allr = load(a.csv, api=True)
        g0 = min(r["start"] for r in allr if r["kind"] != "R")
        print("     start       end     own  where  record")
        for r in allr:
            s0 = (r["start"] - g0) / 1e3
            if lo <= s0 <= hi:
                where = ("host " if r["kind"] == "R" else "s") + str(r["stream"] % 100000)
                e0, own = (r["end"] - g0) / 1e3, (r["end"] - r["start"]) / 1e3
                print(f"  {s0:9.1f} {e0:9.1f} {own:7.1f}  {where:<10} {r['short']}")
    rows = load(a.csv)
    t0 = min(r["start"] for r in rows)
    t1 = max(r["end"] for r in rows)
    # the union of busy time: when at least one record runs
    busy = 0
    cur_s = cur_e = None
    for r in rows:
        if cur_e is None or r["start"] > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = r["start"], r["end"]
        else:
            cur_e = max(cur_e, r["end"])
    busy += cur_e - cur_s
    own = sum(r["end"] - r["start"] for r in rows)
    streams = collections.Counter(r["stream"] for r in rows)
    print(f"{len(rows)} records on {len(streams)} streams, span {(t1 - t0) / 1e3:.1f} us, something running "
          f"{busy / 1e3:.1f} us ({100.0 * busy / max(1, t1 - t0):.1f}%), own spans summed {own / 1e3:.1f} us")
    for s, n in streams.most_common():
        print(f"  stream {s}: {n} records")
    if a.gaps:
        gaps, cur, last = [], None, None
        for r in rows:
            if cur is not None and r["start"] > cur:
                gaps.append((cur - t0, r["start"] - cur, last["short"], r["short"]))
            if cur is None or r["end"] > cur:
                cur, last = r["end"], r
        print(f"nothing running: {sum(g[1] for g in gaps) / 1e3:.1f} us in {len(gaps)} gaps; the longest:")
        for g in sorted(gaps, key=lambda g: -g[1])[: a.gaps]:
            print(f"  at {g[0] / 1e3:8.1f} us {g[1] / 1e3:6.1f} us  {g[2]} -> {g[3]}")
    ch = chain(rows)
    ch.reverse()
    charge = collections.defaultdict(float)
    count = collections.Counter()
    owns = collections.defaultdict(float)
    first = rows[ch[0][0]]
    total = 0.0
    lines = []
    for i, p in ch:
        r = rows[i]
        c = r["end"] - (rows[p]["end"] if p is not None else r["start"])
        total += c
        charge[r["short"]] += c
        count[r["short"]] += 1
        owns[r["short"]] += r["end"] - r["start"]
        lines.append(f"  {(r['start'] - t0) / 1e3:9.1f} {(r['end'] - t0) / 1e3:9.1f} s{r['stream']:<3} "
                     f"{(r['end'] - r['start']) / 1e3:7.1f} {c / 1e3:7.1f}  {r['short']}")
    print(f"critical chain: {len(ch)} records, {total / 1e3:.1f} us from {(first['start'] - t0) / 1e3:.1f} us")
    print("| kernel | on the chain | charged us | own us (chain's) | charged % |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for k, v in sorted(charge.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"| {k} | {count[k]} | {v / 1e3:.1f} | {owns[k] / 1e3:.1f} | {100.0 * v / max(1.0, total):.1f} |")
    if a.chain:
        print("     start       end stream   own  charged  kernel")
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
