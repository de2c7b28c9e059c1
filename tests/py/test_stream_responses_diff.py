"""Differential test of the OpenAI Responses OUTPUT side against deepseek-recipe 0.2.0.

    build/deepinfer recipe parse --api responses --request REQ.json [--stream] --deterministic
        --prompt-tokens P --cached-tokens C [--finish stop|length|content_filter] < chunks.jsonl

stdout must equal ``stream_oracle_responses.parse_responses(...)`` byte for byte (SSE text
with ``event:`` lines, or the JSON body without trailing newline).  Cases reuse
stream_gen's Chat cases (model outputs, tools, thinking, JSON mode), converted to Responses
bodies (tools flattened, apply_patch as a custom tool, namespaces, echoed settings).
DEEPINFER_PARSE_CMD="python tests/py/stream_oracle_responses.py" checks the harness itself.
"""

from __future__ import annotations

import json
import random

import pytest

import deepseek_recipe as dr
import stream_cli
import stream_gen
import stream_oracle_responses as so

N_CASES = 360
SEED = 20260301


def _to_responses(case: dict, rng: random.Random) -> dict | None:
    chat = case["request"]
    if "stop" in chat or any(m.get("prefix") for m in chat["messages"]):
        return None  # Responses has no stop sequences and no prefix continuation
    body: dict = {"model": chat["model"], "input": chat["messages"][0]["content"]}
    if rng.random() < 0.3:
        body["input"] = [{"role": "user", "content": [{"type": "input_text", "text": body["input"]}]}]
    think = chat.get("thinking", {}).get("type") != "disabled"
    if not think:
        body["reasoning"] = {"effort": "none"}
    elif "reasoning_effort" in chat:
        body["reasoning"] = {"effort": chat["reasoning_effort"]}
        if rng.random() < 0.3:
            body["reasoning"]["summary"] = rng.choice(["auto", "detailed", None])
    tools = []
    for t in chat.get("tools", []):
        f = t["function"]
        if f["name"] == "apply_patch" and rng.random() < 0.7:
            tools.append({"type": "custom", "name": "apply_patch", "description": "patch"})
            continue
        ft = {"type": "function", "name": f["name"]}
        if rng.random() < 0.7:
            ft["description"] = f["description"]
        if rng.random() < 0.8:
            ft["parameters"] = f["parameters"]
            if rng.random() < 0.3:
                ft["parameters"] = {"type": "object", "properties": {"x": {"type": "number", "minimum": rng.choice(
                    [0.5, 1e-7, 1e16, 2.0, 0.1, 123.456, -3])}}, "required": ["x"]}
        if rng.random() < 0.2:
            ft["strict"] = False
        tools.append(ft)
    if tools and rng.random() < 0.25:
        # a namespace whose flattened names (ns__fn / ns::fn) the output may call
        tools.append({"type": "namespace", "name": "ns", **({"description": "nsd"} if rng.random() < 0.5 else {}),
                      "tools": [{"type": "function", "name": "fn", "parameters": {"type": "object"}}]})
    if tools:
        body["tools"] = tools
    tc = chat.get("tool_choice")
    if tc == "required":
        body["tool_choice"] = "required"
    elif isinstance(tc, dict):
        name = tc["function"]["name"]
        kind = "custom" if any(t["type"] == "custom" and t["name"] == name for t in tools) else "function"
        body["tool_choice"] = {"type": kind, "name": name}
    elif tools and rng.random() < 0.1:
        body["tool_choice"] = rng.choice(["auto", "none"])
    if chat.get("response_format", {}).get("type") == "json_object":
        body["text"] = {"format": {"type": "json_object"}}
    elif rng.random() < 0.2:
        body["text"] = {"format": {"type": "text"}, **({"verbosity": "low"} if rng.random() < 0.5 else {})}
    if rng.random() < 0.3:
        body["instructions"] = rng.choice(["Be brief.", "", "Say \"hi\" 😀\n"])
    if rng.random() < 0.3:
        body["temperature"] = rng.choice([0, 0.7, 1, 1.3, 2, 0.33])
    if rng.random() < 0.3:
        body["top_p"] = rng.choice([0.9, 1, 0.95, 0.1, 1 / 3])
    if rng.random() < 0.2:
        body["max_output_tokens"] = rng.randint(1, 100000)
    if rng.random() < 0.1:
        body["top_logprobs"] = rng.randint(0, 5)
    if rng.random() < 0.1:
        body["user"] = "user-1"
    return body


def _namespaced(text: str, model: str, rng: random.Random) -> str:
    """Sometimes call the namespace function by its flattened name."""
    if rng.random() < 0.5:
        return text
    flat = "ns::fn" if model == "DeepSeek-V4.1-Flash" else "ns__fn"
    return text.replace('name="f"', 'name="%s"' % flat, 1).replace('name="search"', 'name="%s"' % flat, 1)


def responses_cases(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    out: list[dict] = []
    k = 0
    while len(out) < n:
        for case in stream_gen.chat_cases(seed + k, 2 * n):
            body = _to_responses(case, rng)
            if body is None:
                continue
            text = case["text"]
            if any(t["type"] == "namespace" for t in body.get("tools", [])):
                text = _namespaced(text, body["model"], rng)
            try:
                dr.ResponsesRequest(dict(body, stream=False)).convert(dr.ConversionOptions())
            except (ValueError, dr.ConversionError):
                continue
            out.append(dict(case, request=body, text=text))
            if len(out) == n:
                break
        k += 1
    return out


@pytest.fixture(scope="module")
def cases():
    return responses_cases(SEED, N_CASES)


def _oracle(case, chunks, stream):
    return so.parse_responses(case["request"], chunks, stream=stream, prompt_tokens=case["prompt_tokens"],
                              cached_tokens=case["cached_tokens"], finish=case["finish"])


def test_generator_coverage(cases):
    kinds = {c["kind"] for c in cases}
    assert len(cases) >= 300 and len(kinds) >= 7
    body = "".join(_oracle(c, [c["text"]], True) for c in cases[:120])
    for ev in ("response.reasoning_text.delta", "response.output_text.delta", "response.function_call_arguments.delta",
               "response.custom_tool_call_input.delta", '"namespace":"ns"', "response.incomplete", '"phase":"commentary"'):
        assert ev in body, ev


def test_worked_example_exact():
    req = {"model": "DeepSeek-V4-Pro", "input": "Hi"}
    got = so.parse_responses(req, ["Hm.</th", "ink>\n\nHi!"], stream=False, prompt_tokens=30, cached_tokens=10,
                             finish="stop")
    j = json.loads(got)
    assert [o["type"] for o in j["output"]] == ["reasoning", "message"]
    assert j["output"][0]["id"] == "rs_resp_test_0" and j["output"][1]["id"] == "msg_resp_test_1"
    assert j["usage"] == {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 10}, "output_tokens": 2,
                          "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 32}
    assert j["created_at"] == j["completed_at"] == so.CREATED
    sse = so.parse_responses(req, ["Hm.</th", "ink>\n\nHi!"], stream=True, prompt_tokens=30, cached_tokens=10,
                             finish="stop")
    events = sse.split("\n\n")[:-1]
    assert [e.split("\n")[0] for e in events][:4] == ["event: response.created", "event: response.in_progress",
                                                      "event: response.output_item.added",
                                                      "event: response.content_part.added"]
    assert [json.loads(e.split("\n")[1][6:])["sequence_number"] for e in events] == list(range(len(events)))
    assert json.loads(events[-1].split("\n")[1][6:])["response"] == j


def _run_one(cmd, tmp, job):
    i, case, chunks, stream = job
    proc = stream_cli.run_parse(cmd, "responses", case, chunks, stream, so.effective_request, tmp)
    return stream_cli.compare(proc, _oracle(case, chunks, stream))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_cli_matches_reference(cases, parse_cmd, stream):
    stream_cli.check_all(cases, stream_cli.jobs(cases, stream, 2000), lambda j, tmp: _run_one(parse_cmd, tmp, j),
                         lambda c: f"kind={c['kind']} finish={c['finish']}")
