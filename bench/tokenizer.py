#!/usr/bin/env python3
"""Tokenizer benchmark: ours (1 thread, N threads) vs HF tokenizers (1 thread,
batch mode) on the same text in one run, plus the latency of a 77K-token
agent prompt.  Prints one table; see docs/BENCHMARKS.md.

usage: python3 bench/tokenizer.py [--tokenizer FILE] [--mb 8] [--threads 2]
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "py"))


def agent_text(mb):
    """Agent-like traffic: source code, prose and JSON tool results."""
    import random
    from corpus import _stdlib_texts, _rand_json
    r = random.Random(42)
    parts, size = [], 0
    texts = _stdlib_texts()
    while size < mb * 2**20:
        k = r.random()
        if k < 0.75:
            t = r.choice(texts)
            a = r.randrange(max(1, len(t)))
            p = t[a:a + r.randint(200, 6000)]
        else:
            p = json.dumps(_rand_json(r), ensure_ascii=False, indent=2)
        parts.append(p)
        size += len(p.encode())
    return "".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default=str(ROOT / "assets/tokenizers/deepseek-v4/tokenizer.json"))
    ap.add_argument("--mb", type=float, default=8)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt-tokens", type=int, default=77_000)
    args = ap.parse_args()

    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    from tokenizers import Tokenizer
    import tokenizers
    hf = Tokenizer.from_file(args.tokenizer)
    text = agent_text(args.mb)
    # the prompt: a prefix of the text holding prompt-tokens tokens
    ids = hf.encode(text[: args.prompt_tokens * 6], add_special_tokens=False)
    cut = ids.offsets[min(args.prompt_tokens, len(ids.ids)) - 1][1]
    prompt = text[:cut]
    docs = text.split("\n\n")

    def best(fn, reps):
        v = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            v.append(time.perf_counter() - t0)
        return statistics.median(v), v[0]

    hf.encode(prompt, add_special_tokens=False)  # warm HF's cache like ours is warmed
    hf_prompt, _ = best(lambda: hf.encode(prompt, add_special_tokens=False), 5)
    n_tok = len(hf.encode(text, add_special_tokens=False).ids)
    hf_1t, _ = best(lambda: hf.encode(text, add_special_tokens=False), 2)
    hf_docs, _ = best(lambda: [hf.encode(d, add_special_tokens=False) for d in docs], 2)
    hf_batch, _ = best(lambda: hf.encode_batch(docs, add_special_tokens=False), 2)

    with tempfile.TemporaryDirectory() as d:
        tf, pf = pathlib.Path(d, "text.txt"), pathlib.Path(d, "prompt.txt")
        tf.write_bytes(text.encode())
        pf.write_bytes(prompt.encode())
        out = subprocess.run([str(ROOT / "build/bench_tokenizer"), args.tokenizer, str(tf), str(pf),
                              str(args.threads)], capture_output=True, check=True, text=True).stdout
        # cold: first encode in a fresh process (empty BPE caches), median of 5 processes
        cold, empty = {}, {}
        for th in (1, args.threads):
            v = [json.loads(subprocess.run([str(ROOT / "build/bench_tokenizer"), args.tokenizer, str(tf), str(pf),
                                            str(th), "cold"], capture_output=True, check=True,
                                           text=True).stdout) for _ in range(5)]
            cold[th] = statistics.median(x["cold_s"] for x in v)
            empty[th] = statistics.median(x["empty_cache_s"] for x in v)
    o = json.loads(out)
    assert o["text_tokens"] == n_tok, (o["text_tokens"], n_tok)

    mb = o["text_bytes"] / 1e6
    rows = [("HF tokenizers %s, 1 thread" % tokenizers.__version__, hf_1t),
            ("HF tokenizers, 1 thread, per paragraph", hf_docs),
            ("HF tokenizers, encode_batch (%d threads)" % args.threads, hf_batch),
            ("deepinfer, 1 thread", o["serial_s"]),
            ("deepinfer, %d threads (segmented)" % args.threads, o["parallel_s"])]
    print(f"text: {mb:.1f} MB agent-like (code, prose, JSON), {n_tok} tokens, "
          f"tokenizer {pathlib.Path(args.tokenizer).parent.name}; load {o['load_s']*1000:.0f} ms")
    print(f"{'encoder':44} {'MB/s':>8} {'Mtok/s':>8} {'vs HF 1t':>9}")
    for name, s in rows:
        print(f"{name:44} {mb/s:8.1f} {n_tok/s/1e6:8.2f} {hf_1t/s:8.2f}x")
    print()
    print(f"{o['prompt_tokens']}-token prompt ({o['prompt_bytes']/1e3:.0f} KB)   {'ms':>8} {'vs HF 1t':>9}")
    prow = [("HF tokenizers, 1 thread (warm)", hf_prompt),
            ("deepinfer, 1 thread, fresh process", cold[1]),
            ("deepinfer, %d threads, fresh process" % args.threads, cold[args.threads]),
            ("deepinfer, 1 thread, empty BPE caches", empty[1]),
            ("deepinfer, %d threads, empty BPE caches" % args.threads, empty[args.threads]),
            ("deepinfer, 1 thread, warm", o["prompt_warm_1t_s"]),
            ("deepinfer, %d threads, warm" % args.threads, o["prompt_warm_nt_s"])]
    for name, s in prow:
        print(f"{name:44} {s*1000:8.2f} {hf_prompt/s:8.2f}x")


if __name__ == "__main__":
    main()
