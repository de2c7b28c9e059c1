"""Differential test: `deepinfer recipe render --api responses|messages` vs deepseek-recipe 0.2.0.

CLI contract (same as --api chat): `build/deepinfer recipe render --api responses|messages
--encoding v4|v4.1 --jsonl` reads one JSON request body per line on stdin and writes, per input line, one
JSON object per line on stdout: {"prompt": "..."} or {"status": 400, "error": {...}} where "error" is the
full error body {"error": {"message", "type", "param", "code"}} -- the OpenAI-style body for *both* APIs
(0.2.0 uses it for Anthropic Messages too); exit code 0.  See docs/RECIPE-RM.md.
"""

from __future__ import annotations

import json
import subprocess

import pytest

import recipe_gen_rm
import recipe_oracle
from test_recipe_chat_diff import _line, compare

N_VALID = 800
N_INVALID = 200
ENCODINGS = ["v4", "v4.1"]
APIS = ["responses", "messages"]

_GEN = {
    "responses": (recipe_gen_rm.responses_requests, recipe_gen_rm.invalid_responses_requests, 20260201),
    "messages": (recipe_gen_rm.messages_requests, recipe_gen_rm.invalid_messages_requests, 20260301),
}


@pytest.fixture(scope="module")
def corpora():
    out = {}
    for api, (valid_fn, invalid_fn, seed) in _GEN.items():
        valid = [_line(b) for b in valid_fn(seed, N_VALID)]
        invalid = [_line(b) for b in invalid_fn(seed + 1, N_INVALID)]
        out[api] = (valid, invalid)
    return out


def run_cli(deepinfer: str, api: str, encoding: str, lines: list[str]) -> list[dict]:
    stdin = "".join(line + "\n" for line in lines).encode("utf-8")
    proc = subprocess.run(
        [deepinfer, "recipe", "render", "--api", api, "--encoding", encoding, "--jsonl"],
        input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr.decode('utf-8', 'replace')[-2000:]}"
    text = proc.stdout.decode("utf-8")
    # Split on "\n" only: U+2028/U+2029/U+0085 may legally appear raw inside JSON strings.
    out = text.split("\n")
    assert out and out[-1] == "", "CLI output must end with a newline"
    out = out[:-1]
    assert len(out) == len(lines), f"CLI wrote {len(out)} lines for {len(lines)} requests"
    return [json.loads(line) for line in out]


def test_corpus_sizes(corpora):
    for api in APIS:
        valid, invalid = corpora[api]
        assert len(valid) >= 700 and len(invalid) >= 150, api


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_valid_requests_match(deepinfer, corpora, api, encoding):
    valid, _ = corpora[api]
    render = recipe_oracle.RENDERERS[api]
    want = [render(line, encoding) for line in valid]
    assert all("prompt" in w for w in want), "generator produced a request the reference rejects"
    got = run_cli(deepinfer, api, encoding, valid)
    compare(valid, want, got, f"{api}/valid/{encoding}")


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_invalid_requests_match(deepinfer, corpora, api, encoding):
    _, invalid = corpora[api]
    render = recipe_oracle.RENDERERS[api]
    want = [render(line, encoding) for line in invalid]
    assert all("status" in w for w in want), "generator produced a request the reference accepts"
    got = run_cli(deepinfer, api, encoding, invalid)
    compare(invalid, want, got, f"{api}/invalid/{encoding}")
