#!/usr/bin/env python3
"""bench/load.py - N concurrent non-streamed chat requests against a running server; prints the wall time.

  python3 bench/load.py --port 8000 [--n 64] [--max-tokens 16] [--temperature 1] [--top-p 0.95] [--seed 7]

Used to compare a step's sampling cost (temperature > 0) with greedy requests on the same server (docs/BENCHMARKS.md,
"The host sampler"). Standard library only, so it runs on the GPU machine as is.
"""
import argparse
import concurrent.futures as cf
import json
import socket
import time


def one(port, i, a):
    body = json.dumps({"model": "DeepSeek-V4-Pro", "stream": False, "max_tokens": a.max_tokens,
                       "temperature": a.temperature, "top_p": a.top_p, "seed": a.seed,
                       "thinking": {"type": "disabled"},
                       "messages": [{"role": "user", "content": f"prompt {i}: " + "words " * 20}]}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=600)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    d = b""
    while True:
        x = s.recv(65536)
        if not x:
            break
        d += x
    s.close()
    return d.startswith(b"HTTP/1.1 200")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    t = time.time()
    with cf.ThreadPoolExecutor(a.n) as ex:
        ok = sum(ex.map(lambda i: one(a.port, i, a), range(a.n)))
    print(f"temperature {a.temperature:g}, top_p {a.top_p:g}: {a.n} requests x {a.max_tokens} tokens in "
          f"{time.time() - t:.2f} s ({ok} x 200)")


if __name__ == "__main__":
    main()
