"""Differential test of the Anthropic Messages OUTPUT side against deepseek-recipe 0.2.0.

CLI contract (docs/STREAM-MESSAGES.md):

    build/deepinfer recipe parse --api messages --request REQ.json [--stream] --deterministic
        --prompt-tokens P --cached-tokens C [--finish stop|length|content_filter] < chunks.jsonl

chunks.jsonl: one JSON string per line = one backend text chunk (1 token each).  stdout must be
exactly ``stream_oracle_messages.parse_messages(...)``: the SSE text (``event: T\\ndata: {...}\\n\\n``
per event, no [DONE]) with --stream, else the JSON body (no trailing newline).

Cases: the Chat generator's model outputs (tests/py/stream_gen.py) with their requests translated
into Messages bodies (``messages_cases``), every one accepted by 0.2.0.

DEEPINFER_PARSE_CMD="python tests/py/stream_oracle_messages.py" runs the harness against the
oracle's own CLI shim.
"""

from __future__ import annotations

import json
import random

import deepseek_recipe as dr
import pytest

import stream_cli
import stream_gen
import stream_oracle_messages as mo

N_CASES = 360
SEED = 20260301


def _to_messages(case: dict, rng: random.Random) -> dict:
    """A Chat case's request as a Messages body (same model output semantics where possible)."""
    c = case["request"]
    body: dict = {"model": c["model"], "max_tokens": rng.choice([16, 1024, 65536]),
                  "messages": [dict(m) for m in c["messages"] if not m.get("prefix")]}
    if rng.random() < 0.15:
        body["system"] = rng.choice(["You are helpful.", [{"type": "text", "text": "Be brief."}]])
    if c.get("thinking", {}).get("type") == "disabled":
        body["thinking"] = {"type": "disabled"} if rng.random() < 0.85 else None
        if body["thinking"] is None:
            del body["thinking"]
            body["output_config"] = {"effort": "none"}
    else:
        r = rng.random()
        if r < 0.3:
            body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
        elif r < 0.45:
            body["thinking"] = {"type": "adaptive"}
        if c.get("reasoning_effort"):
            body["output_config"] = {"effort": {"low": "low", "high": "high", "max": "max"}[c["reasoning_effort"]]}
    if c.get("tools"):
        body["tools"] = [{"name": t["function"]["name"], "description": t["function"]["description"],
                          "input_schema": t["function"]["parameters"]} for t in c["tools"]]
        tc = c.get("tool_choice")
        if tc is not None:
            # "any" does not force a call in 0.2.0; a named tool does (thinking is off here)
            body["tool_choice"] = ({"type": "tool", "name": c["tools"][0]["function"]["name"]}
                                   if rng.random() < 0.7 else {"type": "any"})
        elif rng.random() < 0.15:
            body["tool_choice"] = {"type": rng.choice(["auto", "none", "any"])}
    if c.get("stop") is not None:
        stops = c["stop"] if isinstance(c["stop"], list) else [c["stop"]]
        body["stop_sequences"] = stops
    if rng.random() < 0.1:
        body["temperature"] = 0.7
    return body


def _accepted(body: dict) -> bool:
    for stream in (False, True):
        try:
            dr.MessagesRequest(mo.effective_request(body, stream)).convert(dr.ConversionOptions())
        except (ValueError, dr.ConversionError):
            return False
    return True


def messages_cases(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for case in stream_gen.chat_cases(seed, n):
        req = _to_messages(case, rng)
        if not _accepted(req):
            raise AssertionError(f"generated request rejected by 0.2.0: {req}")
        out.append(dict(case, request=req))
    return out


@pytest.fixture(scope="module")
def cases():
    return messages_cases(SEED, N_CASES)


def _oracle(case, chunks, stream):
    return mo.parse_messages(case["request"], chunks, stream=stream, prompt_tokens=case["prompt_tokens"],
                             cached_tokens=case["cached_tokens"], finish=case["finish"])


# ---------------------------------------------------------------------------------------------
# Reference self-checks


def test_reference_sse_equals_body(cases):
    """Folding the SSE events gives the body (tool input: parsed partial JSON, {} if invalid)."""
    bad = []
    for i, case in enumerate(cases):
        for chunks in stream_gen.chunkings(case["text"], i, 3):
            s = mo.aggregate_sse(_oracle(case, chunks, True))
            b = mo.aggregate_body(_oracle(case, chunks, False))
            for blk in s["blocks"]:
                if blk["type"] == "tool_use":
                    try:
                        v = json.loads(blk["input"])
                    except ValueError:
                        v = {}
                    blk["input"] = v
            if json.loads(json.dumps(s)) != b:
                bad.append((i, chunks, s, b))
    assert not bad, json.dumps(bad[:2], ensure_ascii=False)[:4000]


def test_worked_example_exact():
    req = {"model": "DeepSeek-V4.1-Flash", "max_tokens": 100, "messages": [{"role": "user", "content": "Hi"}]}
    got = mo.parse_messages(req, ["Short.\n</th", "ink>\n\nHi!"], stream=True, prompt_tokens=30,
                            cached_tokens=0, finish="stop")
    u = ('{"input_tokens":30,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,'
         '"output_tokens":%d,"service_tier":"standard"}')
    ev = [
        ("message_start", '{"type":"message_start","message":{"id":"msg_test","type":"message","role":"assistant",'
                          '"model":"DeepSeek-V4.1-Flash","content":[],"stop_reason":null,"stop_sequence":null,'
                          '"usage":' + u % 0 + '}}'),
        ("content_block_start", '{"type":"content_block_start","index":0,"content_block":'
                                '{"type":"thinking","thinking":"","signature":""}}'),
        ("ping", '{"type":"ping"}'),
        ("content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta",'
                                '"thinking":"Short."}}'),
        ("content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta",'
                                '"signature":"msg_test"}}'),
        ("content_block_stop", '{"type":"content_block_stop","index":0}'),
        ("content_block_start", '{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}'),
        ("content_block_delta", '{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi!"}}'),
        ("content_block_stop", '{"type":"content_block_stop","index":1}'),
        ("message_delta", '{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
                          '"usage":' + u % 2 + '}'),
        ("message_stop", '{"type":"message_stop"}'),
    ]
    assert got == "".join(f"event: {n}\ndata: {d}\n\n" for n, d in ev)
    body = mo.parse_messages(req, ["Short.\n</th", "ink>\n\nHi!"], stream=False, prompt_tokens=30,
                             cached_tokens=0, finish="stop")
    assert body == ('{"id":"msg_test","type":"message","role":"assistant","model":"DeepSeek-V4.1-Flash",'
                    '"content":[{"type":"thinking","thinking":"Short.","signature":"msg_test"},'
                    '{"type":"text","text":"Hi!"}],"stop_reason":"end_turn","stop_sequence":null,'
                    '"usage":' + u % 2 + '}')


D = "｜DSML｜"


def _call(value: str, string: str = "false") -> str:
    return (f"<{D} calls>\n<{D} invoke name=\"f\">\n<{D} parameter name=\"x\" string=\"{string}\">{value}"
            f"</{D} parameter>\n</{D} invoke>\n</{D} calls>")


# (parameter value, input in the body): serde_json re-serialisation; invalid JSON -> {}
TOOL_INPUTS = [
    ("1e-7", '{"x":1e-7}'), ("-1.25e4", '{"x":-12500.0}'), ("1e16", '{"x":1e+16}'),
    ("1e15", '{"x":1000000000000000.0}'), ("1e-5", '{"x":0.00001}'), ("-0", '{"x":-0.0}'),
    ("18446744073709551615", '{"x":18446744073709551615}'), ("18446744073709551616", '{"x":1.8446744073709552e+19}'),
    ("-9223372036854775809", '{"x":-9.223372036854776e+18}'), ("1e-400", '{"x":0.0}'), ("1e400", "{}"),
    ('{"a":1,"b":3,"a":2}', '{"x":{"a":2,"b":3}}'), ('[1,  2 ]', '{"x":[1,2]}'), ('"a\\/b\\u00e9"', '{"x":"a/bé"}'),
    ('"\\ud83d\\ude00"', '{"x":"😀"}'), ('"\\ud800"', "{}"), ('"\\udc00"', "{}"), ('"\\u0000"', '{"x":"\\u0000"}'),
    ("01", "{}"), ("1.", "{}"), ("NaN", "{}"), ("tru", "{}"), ("[" * 126 + "]" * 126, '{"x":' + "[" * 126 + "]" * 126 + "}"),
    ("[" * 127 + "]" * 127, "{}"),
]


@pytest.mark.parametrize("value,want", TOOL_INPUTS)
def test_tool_input_reserialised(value, want, parse_cmd):
    req = {"model": "DeepSeek-V4-Pro", "max_tokens": 10, "messages": [{"role": "user", "content": "Hi"}],
           "thinking": {"type": "disabled"}, "tools": [{"name": "f", "input_schema": {"type": "object"}}]}
    body = mo.parse_messages(req, [_call(value)], stream=False, prompt_tokens=3, cached_tokens=0, finish="stop")
    j = json.loads(body)
    assert body.count('"input":' + want + "}") == 1, body
    assert j["stop_reason"] == "tool_use"
    case = {"request": req, "prompt_tokens": 3, "cached_tokens": 0, "finish": "stop"}
    assert _run_one(parse_cmd, None, (0, case, [_call(value)], False)) is None


# ---------------------------------------------------------------------------------------------
# CLI vs reference


def _run_one(cmd, tmp, job):
    i, case, chunks, stream = job
    proc = stream_cli.run_parse(cmd, "messages", case, chunks, stream, mo.effective_request, tmp)
    return stream_cli.compare(proc, _oracle(case, chunks, stream))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_cli_matches_reference(cases, parse_cmd, stream):
    job_list = stream_cli.jobs(cases, stream, 2000)
    assert len(job_list) >= 600
    stream_cli.check_all(cases, job_list, lambda j, tmp: _run_one(parse_cmd, tmp, j),
                         lambda c: f"kind={c['kind']} finish={c['finish']}")
