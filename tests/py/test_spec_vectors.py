"""The spec's test vectors (../shared/spec/recipe.md §8.1 rendering, §8.2 stream parsing), with
deepseek-recipe 0.2.0 as the witness.

For every vector: ours == the package, byte for byte.  Then the spec's stated expectation is
checked; where 0.2.0 disagrees with the spec, the vector is listed in SPEC_WRONG with what the
package does instead (the spec says: where they disagree, the package is right), and the test
asserts that the disagreement is still there, so the list cannot go stale."""
import json
import os
import subprocess
import tempfile

import pytest

import recipe_oracle
import stream_oracle as so

D = "\uff5cDSML\uff5c"
M = "DeepSeek-V4.1-Flash"
E75 = "Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
BOS = "<｜begin▁of▁sentence｜>"
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


def render(deepinfer, body, enc="v4.1"):
    p = subprocess.run([deepinfer, "recipe", "render", "--api", "chat", "--encoding", enc, "--jsonl"],
                       input=(json.dumps(body, ensure_ascii=False) + "\n").encode(), capture_output=True, check=True)
    got = json.loads(p.stdout)
    assert got == recipe_oracle.render_chat(body, enc)
    return got


RENDER = {
    "T-R1": ({"model": M, "messages": [{"role": "user", "content": "hello"}], "thinking": {"type": "disabled"}},
             lambda g: g["prompt"] == BOS + "<｜User｜>hello<｜Assistant｜></think>"),
    "T-R2": ({"model": M, "messages": [{"role": "user", "content": "hello"}]},
             lambda g: g["prompt"] == BOS + "<｜System｜>" + E75 + "<｜User｜>hello<｜Assistant｜><think>"),
    "T-R3": ({"model": M, "reasoning_effort": "minimal", "messages": [
                {"role": "user", "content": "first"}, {"role": "user", "content": "second"},
                {"role": "assistant", "content": "answer", "reasoning_content": "prior reasoning"},
                {"role": "system", "content": "new instruction"}]},
             lambda g: g["prompt"] == BOS + "<｜System｜>Reasoning Effort: 50 (range 1-100, the higher the value, the "
             "more thorough the reasoning)\n\n<｜User｜>first\n\nsecond<｜Assistant｜><think>prior reasoning</think>answer"
             "<｜end▁of▁sentence｜><｜System｜>new instruction<｜Assistant｜><think>"),
    "T-R4": ({"model": M, "thinking": {"type": "disabled"}, "tools": [TOOL], "tool_choice": "required",
              "messages": [{"role": "user", "content": "x"}]},
             lambda g: g["prompt"].endswith(f"<｜Assistant｜></think>\n\n<{D} calls>\n")),
    "T-R4b": ({"model": M, "thinking": {"type": "enabled"}, "tools": [TOOL], "tool_choice": "required",
               "messages": [{"role": "user", "content": "x"}]},
              lambda g: g["status"] == 400 and "Thinking mode does not support" in g["error"]["error"]["message"]),
    "T-R5": ({"model": M, "thinking": {"type": "disabled"}, "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function", "function": {
                    "name": "f", "arguments": '{"z":{"b":1,"a":2},"a":true}'}}]},
                {"role": "tool", "tool_call_id": "1", "content": "r"}]},
             lambda g: f'<{D} parameter name="z" string="false">{{"b": 1, "a": 2}}</{D} parameter>\n'
                       f'<{D} parameter name="a" string="false">true</{D} parameter>' in g["prompt"]),
    "T-R6": ({"model": M, "thinking": {"type": "disabled"}, "messages": [{"role": "user", "content": "x"}], "tools": [
                {"type": "function", "function": {"name": "f", "strict": True, "description": "中文", "parameters": {
                    "type": "object", "properties": {
                        "z": {"type": "number", "enum": [0.0, -0.0, 0.0001, 1e-5, 1e-6, 1e-9]},
                        "a": {"description": "quote: \"", "type": "string"}}}}}]},
             lambda g: '### Available Tool Schemas\n\n{"name": "f", "description": "中文", "parameters": {"type": '
                       '"object", "properties": {"z": {"type": "number", "enum": [0.0, -0.0, 0.0001, 1e-05, 1e-06, '
                       '1e-09]}, "a": {"description": "quote: \\"", "type": "string"}}}}\n\n' in g["prompt"]),
    "T-R8": ({"model": M, "response_format": {"type": "json_object"}, "messages": [{"role": "user", "content": "Return JSON"}]},
             lambda g: 'schema to reply:\n{"type": "json_object"}' in g["prompt"]),
    "T-R8b": ({"model": M, "response_format": {"type": "json_object"}, "messages": [{"role": "user", "content": "Return it"}]},
              lambda g: g.get("status") == 400),
}

# vector -> what 0.2.0 does instead (each verified by the assertion below)
SPEC_WRONG = {
    # historical reasoning is dropped unless the request has tools (docs/RECIPE.md)
    "T-R3": lambda g: "<｜Assistant｜></think>answer<｜end▁of▁sentence｜>" in g["prompt"],
    # strict tools are re-serialised: enum dropped for numbers, keys reordered, closed objects
    "T-R6": lambda g: '"parameters": {"type": "object", "properties": {"z": {"type": "number"}, "a": {"type": '
                      '"string", "description": "quote: \\""}}, "additionalProperties": false, "required": ["z", "a"]}'
                      in g["prompt"],
    # tool-call arguments are parsed with parameter names ending at the first space (docs/STREAM.md)
    "T-S1": lambda a: a["tool_calls"][0]["arguments"].startswith('{"shipping: '),
}


@pytest.mark.parametrize("vid", list(RENDER))
def test_render_vectors(deepinfer, vid):
    body, spec_ok = RENDER[vid]
    got = render(deepinfer, body)
    if vid in SPEC_WRONG:
        assert not spec_ok(got) and SPEC_WRONG[vid](got)
    else:
        assert spec_ok(got)


def parse(deepinfer, body, chunks, finish="stop", stream=False):
    with tempfile.TemporaryDirectory() as tmp:
        req = os.path.join(tmp, "r.json")
        eff = so.effective_request(body, stream)
        open(req, "w", encoding="utf-8").write(json.dumps(eff, ensure_ascii=False))
        argv = [deepinfer, "recipe", "parse", "--api", "chat", "--request", req, "--deterministic",
                "--prompt-tokens", "4"] + (["--stream"] if stream else []) + (["--finish", finish] if finish else [])
        out = subprocess.run(argv, input="".join(json.dumps(c, ensure_ascii=False) + "\n" for c in chunks).encode(),
                             capture_output=True, check=True).stdout.decode()
    assert out == so.parse_chat(body, "v4.1", chunks, stream=stream, prompt_tokens=4, cached_tokens=0, finish=finish)
    return so.aggregate_sse(out) if stream else so.aggregate_body(out)


def call(name, params, v41=True):
    sp = " " if v41 else ""
    ps = "".join(f'<{D}{sp}parameter name="{k}" string="{s}">{v}</{D}{sp}parameter>\n' for k, s, v in params)
    return f'<{D}{sp}invoke name="{name}">\n{ps}</{D}{sp}invoke>\n'


def block(calls, v41=True):
    b = " calls" if v41 else "tool_calls"
    return f"<{D}{b}>\n" + "".join(calls) + f"</{D}{b}>"


OFF = {"model": M, "thinking": {"type": "disabled"}, "messages": [{"role": "user", "content": "x"}], "tools": [TOOL]}
ON = {"model": M, "messages": [{"role": "user", "content": "x"}], "tools": [TOOL]}
CALL = block([call("lookup", [("value", "true", 'STOP 中文 "\\\n'), ("object", "false", '{"x": [1, true, null]}')]),
              call("done", [])])


def parses_to(text, want):
    try:
        return json.loads(text) == want
    except ValueError:
        return False


def with_(base, **kw):
    b = json.loads(json.dumps(base))
    b.update(kw)
    return b


STREAM = {
    "T-S1": (OFF, [block([call("submit", [("shipping address", "true", "Paris\n日本"), ("count", "false", "2")])])],
             "stop", lambda a: parses_to(a["tool_calls"][0]["arguments"], {"shipping address": "Paris\n日本", "count": 2})),
    "T-S2": (with_(OFF, stop=["STOP"]), [CALL], "stop",
             lambda a: [(c["name"], c["arguments"]) for c in a["tool_calls"]] ==
             [("lookup", '{"value": "STOP 中文 \\"\\\\\\n", "object": {"x": [1, true, null]}}'), ("done", "{}")]
             and a["finish_reason"] == "tool_calls"),
    "T-S3": (with_(ON, stop=["STOP"]), ["\n\nreason STOP stays\n\n</think>\nanswer ST", "OP hidden"], "length",
             lambda a: a["reasoning_content"] == "reason STOP stays" and a["content"] == "answer "
             and a["finish_reason"] == "stop"),
    "T-S5": (with_(OFF, stop=["STOP"], response_format={"type": "json_object"},
                   messages=[{"role": "user", "content": "json"}]),
             [' STOP intro ```json\n{"value": "ok"}\n``` STOP suffix '], "stop",
             lambda a: json.loads(a["content"].strip(" ")) == {"value": "ok"}),
    "T-S7": (with_(OFF, stop=["STOP"]), ["hello </thi"], "stop", lambda a: a["content"] == "hello </thi"),
    "T-S8": (OFF, [f'<{D} calls><{D} invoke name="lookup"><{D} parameter name="a" string="true">unfinished'], "length",
             lambda a: a["tool_calls"][0]["arguments"] == '{"a": "unfinished' and a["finish_reason"] == "length"),
    "T-S9": (with_(OFF, tools=None), [CALL], "stop", lambda a: a["content"] == CALL),
    "T-S10": (with_(OFF, tools=None), ["a</think>b</think>c"], "stop", lambda a: a["content"] == "abc"),
    "T-S11": (OFF, [block([call("f", [("value", "false", '["a", 1, null]')])])], "stop",
              lambda a: json.loads(a["tool_calls"][0]["arguments"]) == {"value": ["a", 1, null]}),
    "T-S13": (with_(ON, tools=None), ["</think>Custom answer"], "stop",
              lambda a: a["content"] == "Custom answer"),
    "T-S17": (OFF, ["Sure.\n\n" + block([call("g", [])]) + "trailing"], "stop",
              lambda a: a["content"] == "Sure." and a["tool_calls"][0]["arguments"] == "{}"),
    "T-S18": (with_(ON, tools=None), ["think\n</think>\n\nAnswer"], "stop",
              lambda a: a["reasoning_content"] == "think" and a["content"] == "Answer"),
    "T-S19": (with_(OFF, tools=None), ["\n\nHello\n\nworld\n"], "stop", lambda a: a["content"] == "Hello\n\nworld\n"),
    "T-S20": (OFF, [block([call("f", [("a", "true", "")])])], "stop",
              lambda a: a["tool_calls"][0]["arguments"] == '{"a": ""}'),
}
null = None


@pytest.mark.parametrize("vid", list(STREAM))
@pytest.mark.parametrize("per_char", [False, True], ids=["whole", "per-char"])
def test_stream_vectors(deepinfer, vid, per_char):
    body, chunks, finish, spec_ok = STREAM[vid]
    if body.get("tools") is None:
        body = {k: v for k, v in body.items() if k != "tools"}
    if per_char:
        chunks = [ch for c in chunks for ch in c]
    for stream in (False, True):
        agg = parse(deepinfer, body, chunks, finish, stream)
        if vid in SPEC_WRONG:
            assert not spec_ok(agg) and SPEC_WRONG[vid](agg)
        else:
            assert spec_ok(agg), agg
