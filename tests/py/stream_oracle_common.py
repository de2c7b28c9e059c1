"""What the three stream oracles (stream_oracle.py: chat, stream_oracle_messages.py, stream_oracle_responses.py)
share: the deterministic values their outputs are normalised to, the finish reasons, and the CLI shim with the
contract of `deepinfer recipe parse`, which lets the diff tests check their harness against an oracle
(DEEPINFER_PARSE_CMD)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

import deepseek_recipe as dr

CREATED = 1767225600
FINGERPRINT = "fp_test"
DETERMINISTIC_CALL_SUFFIX = "TESTTESTTESTTESTTEST0000"

FINISH = {
    "stop": dr.InferenceFinishReason.Stop,
    "length": dr.InferenceFinishReason.Length,
    "content_filter": dr.InferenceFinishReason.ContentFilter,
}


def cli_main(argv: list[str] | None, prog: str, api: str, encoding: str | None,
             parse: Callable[[dict, str | None, list, argparse.Namespace], str], strings_only: bool = True) -> int:
    """`<prog> recipe parse --api <api> --request FILE [--stream] --deterministic --prompt-tokens N --cached-tokens N
    [--finish F]` with the model output as one JSON value a line on stdin; encoding: "required", "optional" or None
    (no --encoding option).  Writes parse(request, encoding, chunks, args) to stdout."""
    ap = argparse.ArgumentParser(prog=f"{prog} recipe parse")
    ap.add_argument("recipe")
    ap.add_argument("parse")
    ap.add_argument("--api", choices=[api], required=True)
    if encoding:
        ap.add_argument("--encoding", choices=["v4", "v4.1"], required=encoding == "required")
    ap.add_argument("--request", required=True)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--deterministic", action="store_true", required=True)
    ap.add_argument("--prompt-tokens", type=int, required=True)
    ap.add_argument("--cached-tokens", type=int, required=True)
    ap.add_argument("--finish", choices=sorted(FINISH))
    a = ap.parse_args(argv)
    assert a.recipe == "recipe" and a.parse == "parse"
    with open(a.request, "rb") as f:
        request = json.loads(f.read().decode("utf-8"))
    lines = sys.stdin.buffer.read().decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    chunks = [json.loads(line) for line in lines]
    if strings_only:
        assert all(isinstance(c, str) for c in chunks), "each chunks.jsonl line must be a JSON string"
    out = parse(request, getattr(a, "encoding", None), chunks, a)
    sys.stdout.buffer.write(out.encode("utf-8"))
    return 0
