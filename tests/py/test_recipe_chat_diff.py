"""Differential test: `deepinfer recipe render --api chat` vs deepseek-recipe 0.2.0.

CLI contract: `build/deepinfer recipe render --api chat --encoding v4|v4.1 --jsonl`
reads one JSON request body per line on stdin and writes, per input line, one
JSON object per line on stdout: {"prompt": "..."} or {"status": 400, "error": {...}}
where "error" is the full error body, i.e. {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import json
import subprocess

import pytest

import recipe_gen
import recipe_oracle

N_VALID = 1500
N_RAW = 100
N_INVALID = 300
ENCODINGS = ["v4", "v4.1"]


def _line(body) -> str:
    """The exact stdin line for a body (dict -> JSON text; raw str kept as is)."""
    if isinstance(body, str):
        assert "\n" not in body and "\r" not in body, "raw body must be a single line"
        return body
    # ensure_ascii=False keeps U+2028/U+2029 and other non-ASCII raw inside the line.
    return json.dumps(body, ensure_ascii=False)


@pytest.fixture(scope="module")
def corpus():
    valid = [_line(b) for b in recipe_gen.chat_requests(20260101, N_VALID)]
    valid += recipe_gen.raw_chat_requests(20260102, N_RAW)
    invalid = [_line(b) for b in recipe_gen.invalid_chat_requests(20260103, N_INVALID)]
    return valid, invalid


def run_cli(deepinfer: str, encoding: str, lines: list[str]) -> list[dict]:
    stdin = "".join(line + "\n" for line in lines).encode("utf-8")
    proc = subprocess.run(
        [deepinfer, "recipe", "render", "--api", "chat", "--encoding", encoding, "--jsonl"],
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


def _first_diff(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def describe(line: str, want: dict, got: dict) -> str:
    msg = [f"request: {line[:3000]}"]
    if "prompt" in want and "prompt" in got:
        a, b = want["prompt"], got["prompt"]
        i = _first_diff(a, b)
        lo = max(0, i - 80)
        msg.append(f"prompt differs at code point {i} (len want {len(a)}, got {len(b)})")
        msg.append(f"  want[{lo}:]: {a[lo:i + 80]!r}")
        msg.append(f"  got [{lo}:]: {b[lo:i + 80]!r}")
    else:
        msg.append(f"  want: {json.dumps(want, ensure_ascii=False)[:2000]}")
        msg.append(f"  got : {json.dumps(got, ensure_ascii=False)[:2000]}")
    return "\n".join(msg)


def compare(lines: list[str], want: list[dict], got: list[dict], label: str):
    bad = [i for i, (w, g) in enumerate(zip(want, got)) if w != g]
    if bad:
        shown = "\n\n".join(f"[{label} #{i}]\n" + describe(lines[i], want[i], got[i]) for i in bad[:5])
        pytest.fail(f"{len(bad)}/{len(lines)} {label} mismatches; first ones:\n{shown}")


def test_corpus_sizes(corpus):
    valid, invalid = corpus
    assert len(valid) >= 1500 and len(invalid) >= 250


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_valid_requests_match(deepinfer, corpus, encoding):
    valid, _ = corpus
    want = [recipe_oracle.render_chat(line, encoding) for line in valid]
    assert all("prompt" in w for w in want), "generator produced a request the reference rejects"
    got = run_cli(deepinfer, encoding, valid)
    compare(valid, want, got, f"valid/{encoding}")


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_invalid_requests_match(deepinfer, corpus, encoding):
    _, invalid = corpus
    want = [recipe_oracle.render_chat(line, encoding) for line in invalid]
    assert all("status" in w for w in want), "generator produced a request the reference accepts"
    got = run_cli(deepinfer, encoding, invalid)
    compare(invalid, want, got, f"invalid/{encoding}")


def test_token_ids_match(deepinfer, corpus):
    """`deepinfer recipe tokens` == the package's encode() with the V4 tokenizer (V4 encoding),
    on every valid request: control ids only where the template put them."""
    valid, _ = corpus
    want = [recipe_oracle.render_chat(line, "v4", ids=True)["ids"] for line in valid]
    stdin = "".join(line + "\n" for line in valid).encode("utf-8")
    proc = subprocess.run([deepinfer, "recipe", "tokens", "--api", "chat", "--encoding", "v4", "--jsonl"],
                          input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    got = [json.loads(x)["ids"] for x in proc.stdout.decode().split("\n")[:-1]]
    assert len(got) == len(want)
    bad = [i for i in range(len(want)) if got[i] != want[i]]
    assert not bad, f"{len(bad)} differ; first request: {valid[bad[0]][:500]}"


def test_injection_every_added_token(deepinfer):
    """Every added-token string of the V4 tokenizer, placed in system, user, tool, assistant and
    reasoning text, never becomes a control id: the ids equal the same request with that text
    replaced by plain letters, control-id for control-id."""
    import pathlib
    tj = json.loads((pathlib.Path(__file__).resolve().parents[2] /
                     "assets/tokenizers/deepseek-v4/tokenizer.json").read_text(encoding="utf-8"))
    added_ids = {t["id"] for t in tj["added_tokens"]}
    text = " ".join(t["content"] for t in tj["added_tokens"])

    def req(s):
        return {"model": "DeepSeek-V4-Pro", "thinking": {"type": "enabled"},
                "tools": [{"type": "function", "function": {"name": "f", "description": s}}],
                "messages": [{"role": "system", "content": s}, {"role": "user", "content": s},
                             {"role": "assistant", "content": s, "reasoning_content": s, "tool_calls": [
                                 {"id": "1", "type": "function", "function": {"name": "f", "arguments": json.dumps({"a": s})}}]},
                             {"role": "tool", "tool_call_id": "1", "content": s}, {"role": "user", "content": s}]}

    def control_ids(body):
        p = subprocess.run([deepinfer, "recipe", "tokens", "--api", "chat", "--encoding", "v4"],
                           input=json.dumps(body).encode(), capture_output=True, check=True)
        return [i for i in json.loads(p.stdout) if i in added_ids]

    attacked = control_ids(req(text))
    assert attacked == control_ids(req("plain")), "request text produced a control token"
    # Deliberate deviation: deepseek-recipe 0.2.0 turns special=true added tokens (e.g. <｜/polygon｜>,
    # id 129271) inside historical *assistant content* into control ids. We never do (docs/RECIPE.md).
    ref = [i for i in recipe_oracle.render_chat(req(text), "v4", ids=True)["ids"] if i in added_ids]
    assert len(ref) > len(attacked), "the reference no longer leaks: drop the deviation note"
