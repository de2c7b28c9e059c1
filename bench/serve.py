#!/usr/bin/env python3
"""bench/serve.py - the HTTP server over loopback.

  python3 bench/serve.py [--quick]

Three measurements, each against a reference taken in the same run:
 1. server overhead: the scripted TEST backend (no model, ~0 cost per step)
    streams tokens; server CPU seconds (from /proc, all threads) / tokens
    streamed = overhead per token.  Reference: the 20 us/token target.
    Also requests/s for short non-streamed requests.
 2. the tiny model (make-tiny-model preset tiny): TTFT and TPOT percentiles at
    1, 16 and 64 concurrent streams.  Reference: the model's own decode step
    time at batch 1 (bench_model_cpu), so TPOT/step says what serving and
    batching add.
    Then 64 sampled streams (temperature 1, top_p 0.95): the server as
    shipped against the same server drawing every token through the
    sampler's full computation on one thread (DEEPINFER_SAMPLE_PRUNE=0
    --sample-threads 1, how it sampled before the fast paths), same run.
 3. open SSE streams held at once (target >= 5000), each receiving its
    headers and keep-alive comments.
"""
import argparse
import concurrent.futures as cf
import json
import os
import pathlib
import re
import resource
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOKEN_RE = re.compile(rb'"content":"[^"]')
BIN = ROOT / "build" / "deepinfer"


def start(*args, env=None):
    p = subprocess.Popen([str(BIN), "serve", "--port", "0", "--quiet", *args], stderr=subprocess.PIPE, text=True,
                         env=env)
    for line in p.stderr:
        m = re.search(r"on http://[\d.]+:(\d+)", line)
        if m:
            return p, int(m.group(1))
    raise SystemExit("server did not start")


def stop(p):
    p.terminate()
    p.wait(timeout=30)


def cpu_seconds(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def stream_request(port, body, timeout=300):
    """POST a streaming request; returns (ttft, [token arrival times], n_events)."""
    data = json.dumps(body).encode()
    so = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    t0 = time.perf_counter()
    so.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(data) + data)
    buf, times, first = b"", [], None
    while True:
        d = so.recv(65536)
        if not d:
            break
        now = time.perf_counter()
        buf += d
        n = len(TOKEN_RE.findall(d))  # content deltas with text (not the role chunk's "")
        if n:
            if first is None:
                first = now - t0
            times.extend([now] * n)
    so.close()
    return first, times


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def overhead(quick):
    p, port = start("--backend", "scripted", "--max-running", "64")
    body = {"model": "DeepSeek-V4-Pro", "stream": True, "thinking": {"type": "disabled"},
            "messages": [{"role": "user", "content": "[[script:long]]"}]}
    n_req = 200 if quick else 1000
    c0, t0 = cpu_seconds(p.pid), time.perf_counter()
    with cf.ThreadPoolExecutor(16) as ex:
        res = list(ex.map(lambda _: stream_request(port, body), range(n_req)))
    wall, cpu = time.perf_counter() - t0, cpu_seconds(p.pid) - c0
    tokens = sum(len(t) for _, t in res)
    # short non-streamed requests
    short = json.dumps({"model": "DeepSeek-V4-Pro", "thinking": {"type": "disabled"}, "max_tokens": 4,
                        "messages": [{"role": "user", "content": "hi"}]}).encode()

    def one(_):
        rq = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=short,
                                    headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(rq, timeout=60) as r:
            return r.status

    n_short = 500 if quick else 3000
    t1 = time.perf_counter()
    with cf.ThreadPoolExecutor(32) as ex:
        ok = sum(s == 200 for s in ex.map(one, range(n_short)))
    rps = ok / (time.perf_counter() - t1)
    stop(p)
    us = cpu / tokens * 1e6
    return {"tokens": tokens, "wall_s": wall, "server_cpu_s": cpu, "us_per_token": us, "ratio_to_20us": us / 20,
            "short_requests_per_s": rps}


def model_latency(quick):
    d = pathlib.Path(tempfile.mkdtemp()) / "tiny"
    subprocess.run([str(BIN), "make-tiny-model", str(d)], check=True, capture_output=True)
    step = subprocess.run([str(ROOT / "build" / "bench_model_cpu"), "--prefill", "32", "--decode", "32", str(d)],
                          capture_output=True, text=True, check=True).stdout
    row = [l for l in step.splitlines() if l.startswith("tiny")][0].split()
    step_ms = float(row[4])
    def run(port, conc, n, sampled):
        samp = {"temperature": 1, "top_p": 0.95, "seed": 7} if sampled else {"temperature": 0}
        body = lambda i: {"model": "DeepSeek-V4-Pro", "stream": True, "max_tokens": 32, **samp,
                          "thinking": {"type": "disabled"},
                          "messages": [{"role": "user", "content": f"prompt {i}: " + "words " * 20}]}
        with cf.ThreadPoolExecutor(conc) as ex:
            res = list(ex.map(lambda i: stream_request(port, body(i)), range(n)))
        ttft = [r[0] * 1e3 for r in res if r[0] is not None]
        tpot = [(t[-1] - t[0]) / (len(t) - 1) * 1e3 for _, t in res if len(t) > 1]
        return {"concurrency": conc, "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
                "tpot_p50_ms": pct(tpot, 50), "tpot_p99_ms": pct(tpot, 99),
                "tpot_over_step": pct(tpot, 50) / step_ms, "tokens_per_s": conc / (pct(tpot, 50) / 1e3)}

    args = ("--model", str(d), "--max-running", "64", "--max-batch-tokens", "2048")
    p, port = start(*args)
    out = [run(port, conc, conc * (1 if quick else 2), False) for conc in (1, 16, 64)]
    sampled = {"shipped": run(port, 64, 64 if quick else 128, True)}
    stop(p)
    p, port = start(*args, "--sample-threads", "1", env={**os.environ, "DEEPINFER_SAMPLE_PRUNE": "0"})
    sampled["full, 1 thread"] = run(port, 64, 64 if quick else 128, True)
    stop(p)
    return step_ms, out, sampled


def held_streams(target):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    p, port = start("--backend", "scripted", "--max-running", "256", "--max-waiting", str(target + 100),
                    "--max-connections", str(target + 100), "--scripted-step-ms", "50", "--keepalive-ms", "1000")
    body = json.dumps({"model": "DeepSeek-V4-Pro", "stream": True, "thinking": {"type": "disabled"},
                       "messages": [{"role": "user", "content": "[[script:long]]"}]}).encode()
    req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body) + body)
    sel = selectors.DefaultSelector()
    socks = []
    for i in range(target):
        s = socket.create_connection(("127.0.0.1", port))
        s.setblocking(False)
        s.sendall(req)
        socks.append(s)
        sel.register(s, selectors.EVENT_READ, i)
    got = [b""] * target
    t0 = time.time()
    while time.time() - t0 < 8:
        for key, _ in sel.select(timeout=0.5):
            try:
                d = key.fileobj.recv(65536)
            except BlockingIOError:
                continue
            got[key.data] += d[:64] if len(got[key.data]) < 64 else b""
    open_ok = sum(g.startswith(b"HTTP/1.1 200") for g in got)
    for s in socks:
        s.close()
    stop(p)
    return open_ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--streams", type=int, default=5000)
    a = ap.parse_args()
    print(f"deepinfer serve benchmark ({os.cpu_count()} CPUs)\n")
    o = overhead(a.quick)
    print("1. server overhead, scripted backend (reference: 20 us/token target)")
    print(f"   {o['tokens']} tokens streamed in {o['wall_s']:.2f} s; server CPU {o['server_cpu_s']:.2f} s")
    print(f"   overhead {o['us_per_token']:.2f} us/token = {o['ratio_to_20us']:.2f} x target; "
          f"short requests {o['short_requests_per_s']:.0f} req/s\n")
    step_ms, rows, sampled = model_latency(a.quick)
    print(f"2. tiny model (reference: one decode step at batch 1 = {step_ms:.2f} ms, bench_model_cpu)")
    print(f"   {'streams':>7} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'TPOT p99':>9} {'TPOT/step':>9} {'tok/s':>8}")
    for r in rows:
        print(f"   {r['concurrency']:>7} {r['ttft_p50_ms']:>8.1f}m {r['ttft_p99_ms']:>8.1f}m {r['tpot_p50_ms']:>8.2f}m "
              f"{r['tpot_p99_ms']:>8.2f}m {r['tpot_over_step']:>9.2f} {r['tokens_per_s']:>8.0f}")
    ref = sampled["full, 1 thread"]["tokens_per_s"]
    print(f"   64 sampled streams (temperature 1, top_p 0.95; reference: the full computation on one thread)")
    for name, r in sampled.items():
        print(f"   {name:>15}: TPOT p50 {r['tpot_p50_ms']:.2f} ms, p99 {r['tpot_p99_ms']:.2f} ms, "
              f"{r['tokens_per_s']:.0f} tok/s = {r['tokens_per_s'] / ref:.2f} x the reference")
    n = held_streams(a.streams)
    print(f"\n3. open SSE streams held: {n} of {a.streams} (target >= 5000) = {n / 5000:.2f} x target")


if __name__ == "__main__":
    main()
