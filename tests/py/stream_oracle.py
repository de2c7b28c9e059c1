"""Reference oracle for the Chat Completions OUTPUT side (stream parsing -> SSE / JSON body).

Wraps PyPI ``deepseek-recipe==0.2.0`` the way a 0.2.0 server drives it (see
docs/STREAM.md for every rule; request side: tests/py/recipe_oracle.py):

    conv      = ChatCompletionRequest(body).convert(ConversionOptions())
    generator = ChatCompletionRequest.chunk_generator(conv, ID, body["model"])
    processor = StreamProcessor(generator, conv.parsing_options[, tokenizer])
    processor.push(InferenceChunk.ready(prompt_usage=PromptUsage(P, H), system_fingerprint=FP))
    for each backend chunk: processor.push(InferenceChunk.text(chunk, 1)); stop early once
                            processor.finished (a stop sequence matched)
    processor.push(InferenceChunk.finish(Stop | Length | ContentFilter))   # unless finish is None
    processor.finish()
    stream:     "data: " + chunk.to_json() + "\\n\\n" per output chunk, then "data: [DONE]\\n\\n"
                (ChatCompletionResponse.sse_event_name() is None for every chunk: no "event:" line)
    non-stream: r = ChatCompletionResponse(ID, body["model"], CREATED, 0, 0);
                r.accumulate(chunk) for every output chunk; r.to_json()

Deterministic mode (what ``deepinfer recipe parse --deterministic`` must print):

* completion id ``chatcmpl-test`` (passed to chunk_generator / ChatCompletionResponse);
* ``created`` 1767225600.  0.2.0's chunk generator stamps wall-clock seconds taken when
  the generator is constructed and offers no way to set it, so the oracle rewrites the
  ``"created":N`` field of every stream chunk (it always directly follows the fixed
  ``{"id":"chatcmpl-test","object":"chat.completion.chunk",`` prefix).  The non-stream
  response takes ``created`` as a constructor argument;
* ``system_fingerprint`` ``fp_test`` (carried by the Ready chunk);
* tool-call ids: 0.2.0 generates ``call_{k:02d}_{ET_?}{20 random [A-Za-z0-9]}{4 random digits}``
  (k = call index, zero-padded to 2, more digits from 100 on; the ``ET_`` infix appears when
  thinking is on and no reasoning text was emitted before the call, see STREAM.md).  The
  oracle replaces the random 24-character part with ``DETERMINISTIC_CALL_SUFFIX``, keeping
  ``ET_`` (``call_00_TESTTESTTESTTESTTEST0000``, ``call_01_ET_TESTTESTTESTTESTTEST0000`` ...);
* ``model`` = the request's ``model`` string verbatim;
* every backend text chunk accounts for exactly 1 token (``InferenceChunk.text(c, 1)``),
  so ``completion_tokens`` = number of chunks the processor consumed (see STREAM.md:
  chunks after the one completing a stop sequence are never read).

``stream``: the oracle sets the body's ``stream`` field to the ``stream`` argument
(removing ``stream_options`` when stream is False, since 0.2.0 rejects it then) before
conversion, because the generator derives include_usage from the body.  The
differential test writes that effective body to REQ.json, so body and ``--stream`` agree.

``encoding`` ("v4" / "v4.1") is accepted for the CLI contract but does not influence the
0.2.0 parser: both DSML spellings are always recognised (checked: identical output).

Token-id input: ``parse_chat(..., chunks=[[id, ...], ...], tokens=True)`` pushes
``InferenceChunk.tokens(ids)`` instead, decoded by the V4 tokenizer at
assets/tokenizers/deepseek-v4/tokenizer.json (see STREAM.md "Token-id input").
"""

from __future__ import annotations

import functools
import json
import pathlib
import re
from typing import Any, Sequence

import deepseek_recipe as dr

from stream_oracle_common import CREATED, DETERMINISTIC_CALL_SUFFIX, FINGERPRINT, FINISH, cli_main, drive  # noqa: F401

ROOT = pathlib.Path(__file__).resolve().parents[2]
V4_TOKENIZER = ROOT / "assets" / "tokenizers" / "deepseek-v4" / "tokenizer.json"

COMPLETION_ID = "chatcmpl-test"

_CHUNK_PREFIX = '{"id":%s,"object":"chat.completion.chunk","created":' % json.dumps(COMPLETION_ID)
_CREATED_RE = re.compile(r"^(%s)\d+(,)" % re.escape(_CHUNK_PREFIX))
# Inside JSON text a raw `"id":"call_` can only be a tool-call id key: quotes inside
# strings are always escaped.
_CALL_ID_RE = re.compile(r'"id":"call_(\d+)_(ET_)?[A-Za-z0-9]{20}[0-9]{4}"')


@functools.lru_cache(maxsize=None)
def _tokenizer():
    return dr.Tokenizer.from_file(str(V4_TOKENIZER))


def effective_request(request: dict, stream: bool) -> dict:
    """The body actually converted: ``stream`` forced to the requested mode."""
    body = dict(request)
    body["stream"] = stream
    if not stream:
        body.pop("stream_options", None)
    return body


def _fix_ids(text: str) -> str:
    n_ids = text.count('"id":"call_')
    text, n = _CALL_ID_RE.subn(
        lambda m: '"id":"call_%s_%s%s"' % (m.group(1), m.group(2) or "", DETERMINISTIC_CALL_SUFFIX), text)
    assert n == n_ids, f"unrecognised tool-call id format in {text[:300]}"
    return text


def _fix_chunk(js: str) -> str:
    out, n = _CREATED_RE.subn(lambda m: m.group(1) + str(CREATED) + m.group(2), js, count=1)
    assert n == 1, f"unexpected chunk prefix: {js[:120]}"
    return _fix_ids(out)


def run_processor(
    request: dict,
    chunks: Sequence[Any],
    *,
    stream: bool,
    prompt_tokens: int,
    cached_tokens: int,
    finish: str | None,
    tokens: bool = False,
    token_counts: Sequence[int] | None = None,
    fingerprint: str | None = FINGERPRINT,
):
    """Run 0.2.0 and return (list of raw ChatCompletionChunk, n_chunks_consumed)."""
    body = effective_request(request, stream)
    conv = dr.ChatCompletionRequest(body).convert(dr.ConversionOptions())
    gen = dr.ChatCompletionRequest.chunk_generator(conv, COMPLETION_ID, body["model"])
    proc = dr.StreamProcessor(gen, conv.parsing_options, _tokenizer() if tokens else None)

    def make_chunk(i, c):
        if tokens:
            return dr.InferenceChunk.tokens(list(c))
        return dr.InferenceChunk.text(c, 1 if token_counts is None else token_counts[i])

    return drive(proc, chunks, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens, finish=finish,
                 fingerprint=fingerprint, make_chunk=make_chunk)


def parse_chat(
    request: dict,
    encoding: str,
    chunks: Sequence[Any],
    *,
    stream: bool,
    prompt_tokens: int,
    cached_tokens: int,
    finish: str | None,
    tokens: bool = False,
    token_counts: Sequence[int] | None = None,
) -> str:
    """Exactly what the server sends: SSE text (stream) or the JSON body (non-stream)."""
    assert encoding in ("v4", "v4.1")
    out, _ = run_processor(request, chunks, stream=stream, prompt_tokens=prompt_tokens,
                           cached_tokens=cached_tokens, finish=finish, tokens=tokens,
                           token_counts=token_counts)
    if stream:
        parts = []
        for c in out:
            assert dr.ChatCompletionResponse.sse_event_name(c) is None
            parts.append("data: " + _fix_chunk(c.to_json()) + "\n\n")
        parts.append("data: " + dr.ChatCompletionResponse.sse_done_data() + "\n\n")
        return "".join(parts)
    body = effective_request(request, stream)
    resp = dr.ChatCompletionResponse(COMPLETION_ID, body["model"], CREATED, 0, 0)
    for c in out:
        resp.accumulate(c)
    return _fix_ids(resp.to_json())


# ---------------------------------------------------------------------------------------------
# Aggregation (chunk-boundary invariance checks, docs)


def aggregate_sse(sse: str) -> dict:
    """Fold an SSE text into the final message (content, reasoning, calls, finish, usage)."""
    events = sse.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]", "stream must end with [DONE]"
    content = None
    reasoning = None
    calls: list[dict] = []
    finish = None
    usage = None
    for ev in events[:-2]:
        assert ev.startswith("data: ")
        j = json.loads(ev[6:])
        ch = j["choices"][0]
        d = ch["delta"]
        if d.get("content") is not None:
            content = (content or "") + d["content"]
        if d.get("reasoning_content") is not None:
            reasoning = (reasoning or "") + d["reasoning_content"]
        for tc in d.get("tool_calls") or []:
            k = tc["index"]
            if k == len(calls):
                calls.append({"id": tc["id"], "name": tc["function"]["name"], "arguments": ""})
            calls[k]["arguments"] += tc["function"].get("arguments", "")
        if ch["finish_reason"] is not None:
            finish = ch["finish_reason"]
        if j.get("usage"):
            usage = j["usage"]
    return {"content": content, "reasoning_content": reasoning, "tool_calls": calls,
            "finish_reason": finish, "usage": usage}


def aggregate_body(body: str) -> dict:
    j = json.loads(body)
    ch = j["choices"][0]
    m = ch["message"]
    calls = [{"id": t["id"], "name": t["function"]["name"], "arguments": t["function"]["arguments"]}
             for t in m.get("tool_calls") or []]
    return {"content": m.get("content"), "reasoning_content": m.get("reasoning_content"),
            "tool_calls": calls, "finish_reason": ch["finish_reason"], "usage": j["usage"]}


# ---------------------------------------------------------------------------------------------
# CLI shim with the exact contract of `deepinfer recipe parse --api chat` (used to sanity-check
# tests/py/test_stream_chat_diff.py: DEEPINFER_PARSE_CMD="python tests/py/stream_oracle.py").


def main(argv: list[str] | None = None) -> int:
    return cli_main(argv, "stream_oracle.py", "chat", "required",
                    lambda request, encoding, chunks, a: parse_chat(
                        request, encoding, chunks, stream=a.stream, prompt_tokens=a.prompt_tokens,
                        cached_tokens=a.cached_tokens, finish=a.finish))

if __name__ == "__main__":
    raise SystemExit(main())
