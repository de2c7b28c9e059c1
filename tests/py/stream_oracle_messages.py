"""Reference oracle for the Anthropic Messages OUTPUT side (stream parsing -> SSE / JSON body).

Wraps PyPI ``deepseek-recipe==0.2.0`` the way a 0.2.0 server drives it (docs/STREAM-MESSAGES.md
lists every rule; the Chat twin is tests/py/stream_oracle.py, docs/STREAM.md):

    req       = MessagesRequest(body); model = req.model
    conv      = req.convert(ConversionOptions())
    generator = MessagesRequest.chunk_generator(conv, ID, model)     # signature defaults to ID
    processor = StreamProcessor(generator, conv.parsing_options)
    processor.push(InferenceChunk.ready(prompt_usage=PromptUsage(P, H), system_fingerprint=FP))
    for each backend chunk: processor.push(InferenceChunk.text(chunk, 1)); stop once
                            processor.finished (a stop sequence matched)
    processor.push(InferenceChunk.finish(Stop | Length | ContentFilter))   # unless finish is None
    processor.finish()
    stream:     "event: " + MessagesResponse.sse_event_name(ev) + "\\n" + "data: " + ev.to_json()
                + "\\n\\n" per event; no final data message (sse_done_data() is None)
    non-stream: r = MessagesResponse(ID, model, CREATED, 0, 0); r.accumulate(ev) each; r.to_json()

Deterministic mode (what ``deepinfer recipe parse --api messages --deterministic`` prints):

* message id ``msg_test`` (generator / response constructor argument); thinking-block
  signatures default to the id, so they are ``msg_test`` too;
* tool_use ids: 0.2.0 stamps ``call_{k:02d}_{ET_?}{20 random [A-Za-z0-9]}{4 random digits}``
  exactly as for Chat; the oracle replaces the random 24 characters with
  ``TESTTESTTESTTESTTEST0000`` (keeping ``ET_``);
* ``created`` / ``system_fingerprint`` appear nowhere in Messages output;
* each backend text chunk accounts for exactly 1 token.

``stream``: the body's ``stream`` field is set to the ``stream`` argument before conversion
(it does not change the output; the CLI test writes this effective body to REQ.json).
"""

from __future__ import annotations

import json
import re
from typing import Sequence

import deepseek_recipe as dr

from stream_oracle_common import (CREATED, DETERMINISTIC_CALL_SUFFIX, FINGERPRINT, FINISH, cli_main, drive,  # noqa: F401
                                  effective_request)

MESSAGE_ID = "msg_test"

# Inside JSON text a raw `"id":"call_` can only be a tool_use id key: quotes in strings are escaped.
_CALL_ID_RE = re.compile(r'"id":"call_(\d+)_(ET_)?[A-Za-z0-9]{20}[0-9]{4}"')


def _fix_ids(text: str) -> str:
    n_ids = text.count('"id":"call_')
    text, n = _CALL_ID_RE.subn(
        lambda m: '"id":"call_%s_%s%s"' % (m.group(1), m.group(2) or "", DETERMINISTIC_CALL_SUFFIX), text)
    assert n == n_ids, f"unrecognised tool_use id format in {text[:300]}"
    return text


def run_processor(request: dict, chunks: Sequence[str], *, stream: bool, prompt_tokens: int,
                  cached_tokens: int, finish: str | None):
    """Run 0.2.0; return (list of MessagesStreamEvent, model, n_chunks_consumed)."""
    body = effective_request(request, stream)
    req = dr.MessagesRequest(body)
    model = req.model
    conv = req.convert(dr.ConversionOptions())
    gen = dr.MessagesRequest.chunk_generator(conv, MESSAGE_ID, model)
    proc = dr.StreamProcessor(gen, conv.parsing_options)
    out, consumed = drive(proc, chunks, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens, finish=finish)
    return out, model, consumed


def parse_messages(request: dict, chunks: Sequence[str], *, stream: bool, prompt_tokens: int,
                   cached_tokens: int, finish: str | None) -> str:
    """Exactly what the server sends: SSE text (stream) or the JSON body (non-stream)."""
    out, model, _ = run_processor(request, chunks, stream=stream, prompt_tokens=prompt_tokens,
                                  cached_tokens=cached_tokens, finish=finish)
    if stream:
        assert dr.MessagesResponse.sse_done_data() is None
        parts = []
        for ev in out:
            name = dr.MessagesResponse.sse_event_name(ev)
            assert name is not None
            parts.append("event: " + name + "\ndata: " + _fix_ids(ev.to_json()) + "\n\n")
        return "".join(parts)
    resp = dr.MessagesResponse(MESSAGE_ID, model, CREATED, 0, 0)
    for ev in out:
        resp.accumulate(ev)
    return _fix_ids(resp.to_json())


# ---------------------------------------------------------------------------------------------
# Aggregation (SSE == body checks)


def aggregate_sse(sse: str) -> dict:
    """Fold an SSE text into {content blocks, stop_reason, stop_sequence, usage} (tool input as text)."""
    events = sse.split("\n\n")
    assert events[-1] == ""
    blocks: list[dict] = []
    res: dict = {"blocks": blocks, "stop_reason": None, "stop_sequence": None, "usage": None}
    for ev in events[:-1]:
        head, data = ev.split("\n", 1)
        assert head.startswith("event: ") and data.startswith("data: ")
        j = json.loads(data[6:])
        assert j["type"] == head[7:]
        if j["type"] == "content_block_start":
            assert j["index"] == len(blocks)
            b = dict(j["content_block"])
            if b["type"] == "tool_use":
                b["input"] = ""
            blocks.append(b)
        elif j["type"] == "content_block_delta":
            b, d = blocks[j["index"]], j["delta"]
            key = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature",
                   "input_json_delta": "partial_json"}[d["type"]]
            field = {"partial_json": "input"}.get(key, key)
            b[field] += d[key]
        elif j["type"] == "message_delta":
            res["stop_reason"] = j["delta"]["stop_reason"]
            res["stop_sequence"] = j["delta"]["stop_sequence"]
            res["usage"] = j["usage"]
    return res


def aggregate_body(body: str) -> dict:
    j = json.loads(body)
    return {"blocks": j["content"], "stop_reason": j["stop_reason"], "stop_sequence": j["stop_sequence"],
            "usage": j["usage"]}


# ---------------------------------------------------------------------------------------------
# CLI shim with the exact contract of `deepinfer recipe parse --api messages`
# (DEEPINFER_PARSE_CMD="python tests/py/stream_oracle_messages.py" checks the test harness).


def main(argv: list[str] | None = None) -> int:
    return cli_main(argv, "stream_oracle_messages.py", "messages", "optional",
                    lambda request, encoding, chunks, a: parse_messages(
                        request, chunks, stream=a.stream, prompt_tokens=a.prompt_tokens,
                        cached_tokens=a.cached_tokens, finish=a.finish))

if __name__ == "__main__":
    raise SystemExit(main())
