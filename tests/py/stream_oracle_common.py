"""What the three stream oracles (stream_oracle.py: chat, stream_oracle_messages.py, stream_oracle_responses.py)
share: the deterministic values their outputs are normalised to, the finish reasons, and the CLI shim with the
contract of `deepinfer recipe parse`, which lets the diff tests check their harness against an oracle
(DEEPINFER_PARSE_CMD)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Sequence

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


def effective_request(request: dict, stream: bool) -> dict:
    """The body actually converted: ``stream`` forced to the requested mode (Messages, Responses)."""
    body = dict(request)
    body["stream"] = stream
    return body


def drive(proc, chunks: Sequence[Any], *, prompt_tokens: int, cached_tokens: int, finish: str | None,
          fingerprint: str | None = FINGERPRINT, make_chunk: Callable[[int, Any], Any] | None = None):
    """Feed a deepseek_recipe StreamProcessor as the server does: the ready chunk (prompt usage, fingerprint), the
    chunks (text, one token each, unless make_chunk(i, chunk) says otherwise) until it finishes, then the finish
    reason if any and finish(); it is closed after.  Returns (its events, the chunks consumed)."""
    out: list[Any] = []
    consumed = 0
    try:
        out += proc.push(dr.InferenceChunk.ready(
            prompt_usage=dr.PromptUsage(prompt_tokens=prompt_tokens, prompt_cache_hit_tokens=cached_tokens),
            system_fingerprint=fingerprint))
        for i, c in enumerate(chunks):
            if proc.finished:
                break
            out += proc.push(make_chunk(i, c) if make_chunk else dr.InferenceChunk.text(c, 1))
            consumed += 1
        if not proc.finished:
            if finish is not None:
                out += proc.push(dr.InferenceChunk.finish(FINISH[finish]))
            out += proc.finish()
        assert proc.finished
    finally:
        proc.close()
    return out, consumed
