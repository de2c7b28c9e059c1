#!/usr/bin/env python3
"""bench/kv_multiturn.py - the prefix cache under a multi-turn agent workload.

  python3 bench/kv_multiturn.py [--model DIR] [--sessions N] [--turns K] [--quick]

N sessions share one system prompt and one set of tool schemas (~SYS tokens).
Each turn re-sends the whole conversation: the previous turns, the assistant
answer the server returned, and a new tool result (~TOOL tokens, as a user
message: a random-weight model emits no tool calls).  Sessions run
concurrently (one client thread each; session 0 first, so the shared prefix is
cold once), so their turns interleave in the server's batches; every fourth
session pauses before its third turn for longer than the window-state TTL
(--kv-swa-ttl), so it resumes on the bounded-replay path.

Per configuration (the server's cache flags) it prints:
  - token hit rate: sum of prompt_cache_hit_tokens / sum of prompt tokens,
    over turns >= 2 of every session (turn 1 of session 1 is the only cold one
    for the shared prefix) and over all turns;
  - TTFT by turn (median over sessions) with prompt tokens, to show whether
    TTFT grows with the conversation; the reference is the same workload with
    --kv-cache off measured in the same run (ratio);
  - where hits came from (memory / host / disk blocks, exact vs replay);
  - answer reuse: in how many turns k+1 the hit reaches past the last block
    boundary of turn k's prompt, i.e. into turn k's re-rendered answer.

Notes: the answers of a random-weight model are arbitrary tokens; detokenized
and re-tokenized they are not always the same ids, so the part of turn k+1
that re-renders turn k's answer often misses.  That is measured, not hidden
(line "answer reuse").
"""
import argparse
import concurrent.futures as cf
import json
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = ROOT / "build" / "deepinfer"
MODEL_NAME = "DeepSeek-V4-Pro"


def start(args):
    p = subprocess.Popen([str(BIN), "serve", "--port", "0", *args], stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        m = re.search(r"on http://[\d.]+:(\d+)", line)
        if m:
            return p, int(m.group(1))
    raise SystemExit("server did not start: " + " ".join(args))


def stop(p):
    p.terminate()
    p.wait(timeout=60)


def metrics(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("deepinfer_kv") and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def chat_stream(port, messages, tools, max_tokens):
    body = {"model": MODEL_NAME, "messages": messages, "tools": tools, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            "thinking": {"type": "disabled"}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft = None
    text = []
    usage = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                d = ch.get("delta", {})
                piece = d.get("content") or d.get("reasoning_content")
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text.append(d.get("content") or "")
    if ttft is None:
        ttft = time.perf_counter() - t0
    return "".join(text), usage, ttft


WORDS = ("alpha beta gamma delta kernel buffer socket thread queue index block cache tensor shard "
         "router worker expert layer token prompt stream packet vector matrix").split()


def filler(n_words, seed):
    x = seed * 2654435761 % 2**32
    out = []
    for _ in range(n_words):
        x = (x * 1103515245 + 12345) % 2**31
        out.append(WORDS[x % len(WORDS)])
    return " ".join(out)


def make_tools(n):
    return [{"type": "function", "function": {
        "name": f"tool_{i}", "description": "Runs step %d of the pipeline. %s" % (i, filler(40, i)),
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": filler(12, 100 + i)},
            "depth": {"type": "integer", "description": "how deep"}}, "required": ["path"]}}} for i in range(n)]


def run_session(port, args, s, sys_prompt, tools, swa_ttl):
    msgs = [{"role": "system", "content": sys_prompt},
            {"role": "user", "content": f"Session {s}: start the task. " + filler(30, 1000 + s)}]
    rows = []
    if s:
        time.sleep(0.05 * s)   # staggered starts: session 0 warms the shared prefix first
    for turn in range(1, args.turns + 1):
        if turn == 3 and s % 4 == 3 and swa_ttl:
            time.sleep(swa_ttl + 1.5)   # this session resumes after the window-state TTL
        text, usage, ttft = chat_stream(port, msgs, tools, args.max_tokens)
        rows.append((s, turn, usage["prompt_tokens"], usage.get("prompt_cache_hit_tokens", 0), ttft))
        msgs.append({"role": "assistant", "content": text})
        msgs.append({"role": "user", "content": f"Tool result {turn}: " + filler(args.tool_words, 7 * s + turn)})
    return rows


def run_workload(port, args, sys_prompt, tools, swa_ttl):
    """Sessions run concurrently (one client thread each), so their turns
    interleave in the server's batches; session 0 goes first so the shared
    prefix is cold exactly once."""
    first = run_session(port, args, 0, sys_prompt, tools, swa_ttl)
    with cf.ThreadPoolExecutor(max_workers=args.sessions) as ex:
        futs = [ex.submit(run_session, port, args, s, sys_prompt, tools, swa_ttl) for s in range(1, args.sessions)]
        rest = [r for f in futs for r in f.result()]
    return first + rest


def summarize(name, rows, m, ref_ttft=None):
    tot_p = sum(r[2] for r in rows)
    tot_c = sum(r[3] for r in rows)
    later = [r for r in rows if r[1] >= 2]
    lp = sum(r[2] for r in later)
    lc = sum(r[3] for r in later)
    # blocks the cache could have hit at most: floor((P-1)/128)*128
    bound = sum((r[2] - 1) // 128 * 128 for r in later)
    print(f"\n### {name}\n")
    print(f"token hit rate: turns >= 2 {lc}/{lp} = {100.0 * lc / max(lp, 1):.1f}% "
          f"(block-rounding bound {100.0 * bound / max(lp, 1):.1f}%); all turns {100.0 * tot_c / max(tot_p, 1):.1f}%")
    paths = {k.split('"')[1]: int(v) for k, v in m.items() if k.startswith("deepinfer_kv_lookups_by_path_total")}
    tiers = {k.split('"')[1]: int(v) for k, v in m.items() if k.startswith("deepinfer_kv_block_hits_total")}
    wins = {k.split('"')[1]: int(v) for k, v in m.items() if k.startswith("deepinfer_kv_window_hits_total")}
    prev = {(r[0], r[1]): r[2] for r in rows}
    past = [r for r in later if r[3] > (prev[(r[0], r[1] - 1)] // 128) * 128]
    print(f"answer reuse: {len(past)} of {len(later)} turns hit past the previous prompt's last block boundary")
    print(f"lookups by path: {paths}; block hits by tier: {tiers}; window-state hits: {wins}; "
          f"replayed tokens: {int(m.get('deepinfer_kv_replayed_tokens_total', 0))}")
    turns = sorted({r[1] for r in rows})
    print("\n| turn | prompt tokens (median) | cached (median) | TTFT ms (median) |" +
          (" cache off TTFT ms | ratio |" if ref_ttft else "") + "\n|---:|---:|---:|---:|" +
          ("---:|---:|" if ref_ttft else ""))
    med = {}
    for t in turns:
        rs = [r for r in rows if r[1] == t and not (t == 1 and r[0] == 0)]
        med[t] = statistics.median(r[4] for r in rs) * 1e3
        line = (f"| {t} | {statistics.median(r[2] for r in rs):.0f} | {statistics.median(r[3] for r in rs):.0f} "
                f"| {med[t]:.1f} |")
        if ref_ttft:
            line += f" {ref_ttft[t]:.1f} | {med[t] / ref_ttft[t]:.2f} |"
        print(line)
    return med


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "build" / "bench-models" / "tiny"))
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--sys-words", type=int, default=4000)
    ap.add_argument("--tool-words", type=int, default=100)
    ap.add_argument("--swa-ttl", type=int, default=30,
                    help="window-state TTL for the run (longer than a turn takes here, shorter than the pause)")
    ap.add_argument("--quick", action="store_true", help="4 sessions, 4 turns, shorter prompts")
    args = ap.parse_args()
    if args.quick:
        args.sessions, args.turns, args.sys_words = 4, 4, 1500
    if not (pathlib.Path(args.model) / "config.json").exists():
        subprocess.run([str(BIN), "make-tiny-model", args.model], check=True)
    sys_prompt = "You are an agent working on a build pipeline. " + filler(args.sys_words, 1)
    tools = make_tools(8)
    base = ["--model", args.model, "--quiet", "--kv-swa-ttl", str(args.swa_ttl)]
    print(f"model {args.model}; {args.sessions} sessions x {args.turns} turns; answers {args.max_tokens} tokens; "
          f"window-state TTL {args.swa_ttl} s (sessions 3, 7, ... resume after it at turn 3)")

    p, port = start(base + ["--kv-cache", "off"])
    rows = run_workload(port, args, sys_prompt, tools, 0)
    stop(p)
    ref = summarize("cache off (reference)", rows, {})

    tmp = tempfile.mkdtemp(prefix="kv_multiturn.")
    configs = [
        ("ample memory tier (1 GiB)", []),
        ("ample, exact-only cache (--kv-replay-publish off)", ["--kv-replay-publish", "off"]),
        ("memory 2 MiB, host 0", ["--kv-mem-mb", "2", "--kv-host-mb", "0"]),
        ("memory 1 MiB + host 4 MiB", ["--kv-mem-mb", "1", "--kv-host-mb", "4"]),
        ("memory 0, host 0, disk only", ["--kv-mem-mb", "0", "--kv-host-mb", "0", "--kv-dir", tmp + "/d1"]),
    ]
    if args.quick:
        configs = configs[:1] + configs[-1:]
    table = []
    for name, extra in configs:
        p, port = start(base + extra)
        rows = run_workload(port, args, sys_prompt, tools, args.swa_ttl)
        m = metrics(port)
        stop(p)
        med = summarize(name, rows, m, ref)
        later = [r for r in rows if r[1] >= 2]
        rate = 100.0 * sum(r[3] for r in later) / max(sum(r[2] for r in later), 1)
        table.append((name, rate, med[max(med)] / ref[max(ref)]))
    print("\n### hit rate vs tier capacity\n\n| configuration | token hit rate, turns >= 2 | last-turn TTFT vs cache off |"
          "\n|---|---:|---:|")
    for name, rate, r in table:
        print(f"| {name} | {rate:.1f}% | {r:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
