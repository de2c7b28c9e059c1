"""Reference oracle for the OpenAI Responses OUTPUT side (stream parsing -> SSE / JSON body).

Wraps PyPI ``deepseek-recipe==0.2.0`` the way a 0.2.0 server drives it (facts:
docs/STREAM-RESPONSES.md; the Chat twin is tests/py/stream_oracle.py):

    req  = ResponsesRequest(body); echo = req.echo(); nsmap = req.namespace_tool_map(opts)
    conv = req.convert(opts)                                   # opts = ConversionOptions()
    gen  = ResponsesRequest.chunk_generator(conv, ID, body["model"])
               .with_namespace_tool_map(nsmap).with_echo(echo)
    proc = StreamProcessor(gen, conv.parsing_options)
    proc.push(InferenceChunk.ready(PromptUsage(P, H), system_fingerprint=FP)); text chunks
    (1 token each); Finish chunk unless finish is None; proc.finish()
    stream:     "event: " + sse_event_name(ev) + "\\n" + "data: " + ev.to_json() + "\\n\\n" per event
                (sse_done_data() is None: no terminator)
    non-stream: r = ResponsesResponse(ID, model, CREATED, 0, 0); r.accumulate(ev) each; r.to_json()

Deterministic values (``deepinfer recipe parse --api responses --deterministic``):

* response id ``resp_test`` (item ids ``rs_resp_test_N`` / ``msg_resp_test_N`` / ``fc_resp_test_N``
  / ``ctc_resp_test_N``, reasoning ``encrypted_content`` ``resp_test-N``);
* ``created_at`` and ``completed_at``: 0.2.0 stamps wall-clock seconds (the generator, also for
  the non-stream body: the constructor's ``created`` is overwritten by the events) -> the
  oracle rewrites both to 1767225600 (``completed_at`` stays null while in progress);
* call ids ``call_{k:02d}_`` + ``ET_``? + 24 random chars, as in Chat -> random part replaced by
  ``TESTTESTTESTTESTTEST0000``.
"""

from __future__ import annotations

import json
import re
from typing import Sequence

import deepseek_recipe as dr

from stream_oracle_common import (CREATED, DETERMINISTIC_CALL_SUFFIX, FINGERPRINT, FINISH, cli_main, drive,  # noqa: F401
                                  effective_request)

RESPONSE_ID = "resp_test"

_RESP_HEAD = '{"id":%s,"object":"response","created_at":' % json.dumps(RESPONSE_ID)
_CREATED_RE = re.compile(r"(%s)\d+(,\"status\":\"[a-z_]+\",\"background\":false,\"completed_at\":)(\d+|null)"
                         % re.escape(_RESP_HEAD))
# a raw `"call_id":"call_` outside string values can only be a call id key (quotes in strings are escaped)
_CALL_ID_RE = re.compile(r'"call_id":"call_(\d+)_(ET_)?[A-Za-z0-9]{20}[0-9]{4}"')


def _fix(text: str) -> str:
    n_resp = text.count(_RESP_HEAD)
    text, n = _CREATED_RE.subn(
        lambda m: m.group(1) + str(CREATED) + m.group(2) + (m.group(3) if m.group(3) == "null" else str(CREATED)),
        text)
    assert n == n_resp, f"unexpected response head in {text[:300]}"
    n_ids = text.count('"call_id":"call_')
    text, n = _CALL_ID_RE.subn(
        lambda m: '"call_id":"call_%s_%s%s"' % (m.group(1), m.group(2) or "", DETERMINISTIC_CALL_SUFFIX), text)
    assert n == n_ids, f"unrecognised call id format in {text[:300]}"
    return text


def run_processor(request: dict, chunks: Sequence[str], *, stream: bool, prompt_tokens: int,
                  cached_tokens: int, finish: str | None):
    body = effective_request(request, stream)
    opts = dr.ConversionOptions()
    req = dr.ResponsesRequest(body)
    echo = req.echo()
    nsmap = req.namespace_tool_map(opts)
    conv = req.convert(opts)
    gen = dr.ResponsesRequest.chunk_generator(conv, RESPONSE_ID, body["model"])
    gen = gen.with_namespace_tool_map(nsmap).with_echo(echo)
    proc = dr.StreamProcessor(gen, conv.parsing_options)
    return drive(proc, chunks, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens, finish=finish)[0]


def parse_responses(request: dict, chunks: Sequence[str], *, stream: bool, prompt_tokens: int,
                    cached_tokens: int, finish: str | None) -> str:
    """Exactly what the server sends: SSE text (stream) or the JSON body (non-stream)."""
    out = run_processor(request, chunks, stream=stream, prompt_tokens=prompt_tokens,
                        cached_tokens=cached_tokens, finish=finish)
    if stream:
        assert dr.ResponsesResponse.sse_done_data() is None
        parts = []
        for ev in out:
            name = dr.ResponsesResponse.sse_event_name(ev)
            parts.append("event: %s\ndata: %s\n\n" % (name, _fix(ev.to_json())))
        return "".join(parts)
    resp = dr.ResponsesResponse(RESPONSE_ID, request["model"], CREATED, 0, 0)
    for ev in out:
        resp.accumulate(ev)
    return _fix(resp.to_json())


def main(argv: list[str] | None = None) -> int:
    """CLI shim with the contract of `deepinfer recipe parse --api responses`."""
    return cli_main(argv, "stream_oracle_responses.py", "responses", None,
                    lambda request, encoding, chunks, a: parse_responses(
                        request, chunks, stream=a.stream, prompt_tokens=a.prompt_tokens,
                        cached_tokens=a.cached_tokens, finish=a.finish), strings_only=False)

if __name__ == "__main__":
    raise SystemExit(main())
