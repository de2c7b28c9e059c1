"""The harness the three stream diff tests (chat, responses, messages) share: `deepinfer recipe parse` run on a
case's request and model output, its stdout against the reference parser's, over many cases in parallel.

A case is a dict with "request", "prompt_tokens", "cached_tokens" and "finish" (None: the CLI's default).  The
command is the `parse_cmd` fixture (conftest.py): build/deepinfer, or DEEPINFER_PARSE_CMD to check the harness
against a reference script."""
from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import tempfile

import pytest

import stream_gen


def run_parse(cmd, api, case, chunks, stream, effective_request, tmp=None, extra=(), timeout=120):
    """One `recipe parse --api api` of chunks (a JSON value a line on stdin) for the case: the CompletedProcess"""
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=tmp, delete=False, encoding="utf-8") as f:
        f.write(json.dumps(effective_request(case["request"], stream), ensure_ascii=False))
        req_path = f.name
    try:
        argv = cmd + ["recipe", "parse", "--api", api, *extra, "--request", req_path]
        if stream:
            argv.append("--stream")
        argv += ["--deterministic", "--prompt-tokens", str(case["prompt_tokens"]),
                 "--cached-tokens", str(case["cached_tokens"])]
        if case["finish"] is not None:
            argv += ["--finish", case["finish"]]
        stdin = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in chunks).encode("utf-8")
        return subprocess.run(argv, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    finally:
        os.unlink(req_path)


def compare(proc, want, before=300, after=200):
    """None if the run exited 0 with stdout == want, else what went wrong (the first difference in context)"""
    if proc.returncode != 0:
        return f"exit {proc.returncode}: {proc.stderr.decode('utf-8', 'replace')[-1500:]}"
    got = proc.stdout.decode("utf-8", "replace")
    if got == want:
        return None
    k = next((j for j in range(min(len(got), len(want))) if got[j] != want[j]), min(len(got), len(want)))
    return (f"first difference at char {k}:\n got: {got[max(0, k - before):k + after]!r}\n"
            f"want: {want[max(0, k - before):k + after]!r}")


def jobs(cases, stream, seed_base):
    """Each case's whole text plus one rotating other chunking (1 code point a chunk, marker cuts, random)"""
    out = []
    for i, case in enumerate(cases):
        splits = stream_gen.chunkings(case["text"], seed_base + i, 6)
        picks = [splits[0]] + ([splits[1 + i % (len(splits) - 1)]] if len(splits) > 1 else [])
        for chunks in picks:
            out.append((i, case, chunks, stream))
    return out


def check_all(cases, job_list, check, describe):
    """check(job, tmp) -> None or a message, over job_list in parallel; fails with the count and the first
    mismatch, its case described by describe(case)"""
    with tempfile.TemporaryDirectory() as tmp:
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as ex:
            results = list(ex.map(lambda j: (j, check(j, tmp)), job_list))
    fails = [(j, m) for j, m in results if m is not None]
    if fails:
        (i, _, chunks, _), msg = fails[0]
        case = cases[i]
        pytest.fail(f"{len(fails)}/{len(job_list)} mismatches; first: case {i} {describe(case)}\n"
                    f"request={json.dumps(case['request'], ensure_ascii=False)}\n"
                    f"chunks={json.dumps(chunks, ensure_ascii=False)[:1500]}\n{msg}")
