#!/usr/bin/env python3
"""ncu_agg.py - the GPU time of one profiled step by kernel, from `ncu --csv` output, one listing or two side by side.

On the GPU machine (bench/gpu_layers.c's BENCH_NCU_B makes the last decode step the profiled range):

    BENCH_NCU_B=1 ncu --profile-from-start off --clock-control none --cache-control none \\
        --metrics gpu__time_duration.sum --csv bench_gpu_layers SLICE --batches 1 --contexts 4096 \\
        --prefill 512 --reps 2 > $OUT/step.csv

Then here: `python3 tools/ncu_agg.py before.csv after.csv` prints, per kernel name (template arguments and the
anonymous namespace stripped unless --args), the calls and microseconds of each listing, sorted by the last one, and
the totals.  Lines before the CSV header (the benchmark's own output, ncu's warnings) are skipped; a listing with
other metrics besides gpu__time_duration.sum keeps only that one (--metric picks another, e.g.
smsp__inst_executed.sum, printed as a count).
"""
import argparse
import collections
import csv
import io
import re
import sys


def load(path, metric, keep_args):
    """(kernels, {name: [calls, total]}) of one listing"""
    text = open(path, encoding="utf-8", errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(text) if l.startswith('"ID"')), None)
    if start is None:
        raise SystemExit(f"{path}: no ncu CSV header (\"ID\",...) in it")
    rows = csv.reader(io.StringIO("\n".join(text[start:])))
    hdr = next(rows)
    col = {h: i for i, h in enumerate(hdr)}
    for need in ("ID", "Kernel Name", "Metric Name", "Metric Value"):
        if need not in col:
            raise SystemExit(f"{path}: the CSV has no {need!r} column")
    agg = collections.OrderedDict()
    seen = set()
    for r in rows:
        if len(r) <= col["Metric Value"] or r[col["Metric Name"]] != metric:
            continue
        name = r[col["Kernel Name"]].replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
        if name.startswith("void "):
            name = name[5:]
        if not keep_args:
            name = re.sub(r"[<(].*", "", name)
        try:
            v = float(r[col["Metric Value"]].replace(",", ""))
        except ValueError:
            raise SystemExit(f"{path}: kernel {name!r}: {metric} is {r[col['Metric Value']]!r}, not a number")
        e = agg.setdefault(name, [0, 0.0])
        e[0] += 1
        e[1] += v
        seen.add(r[col["ID"]])
    return len(seen), agg


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="+", help="one or two ncu --csv listings")
    ap.add_argument("--metric", default="gpu__time_duration.sum")
    ap.add_argument("--args", action="store_true", help="keep template arguments in the kernel names")
    ap.add_argument("--top", type=int, default=0, help="rows to print (default: all)")
    a = ap.parse_args(argv)
    if len(a.csv) > 2:
        ap.error("one or two listings")
    time = a.metric == "gpu__time_duration.sum"  # nanoseconds: printed as microseconds
    lists = [load(p, a.metric, a.args) for p in a.csv]
    scale = 1e-3 if time else 1.0
    unit = "us" if time else ""
    names = sorted(set().union(*(agg for _, agg in lists)), key=lambda k: -lists[-1][1].get(k, [0, 0.0])[1])
    tot = " -> ".join(f"{n} kernels, {sum(v for _, v in agg.values()) * scale:,.1f} {unit}".rstrip()
                      for n, agg in lists)
    print(tot)
    for i, k in enumerate(names):
        if a.top and i >= a.top:
            break
        cells = []
        for _, agg in lists:
            c, v = agg.get(k, [0, 0.0])
            cells.append(f"{v * scale:12,.1f} ({c:3d})")
        print(" -> ".join(cells) + "  " + k)
    return 0


if __name__ == "__main__":
    sys.exit(main())
