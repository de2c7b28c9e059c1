"""History round trip (docs/HISTORY-ROUNDTRIP.md): does turn k+1's prompt start with
turn k's prompt + exactly what the model generated (+ EOS), bytes and token ids?

Model output -> `deepinfer recipe parse` (the API body) -> the assistant message as returned,
plus tool results -> `deepinfer recipe render|tokens` -> compare.  The reference
(deepseek-recipe 0.2.0) runs the same round trip in-process; every place the round trip
breaks is a property of the format, which the reference shares (asserted here), never a
difference of ours.  Corpus and harness: history_roundtrip.py.
"""

from __future__ import annotations

import json
import random
import subprocess
import tempfile

import pytest

import history_roundtrip as h
import stream_gen
import stream_oracle_responses

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def runs(deepinfer):
    return h.run_all(deepinfer, h.corpus())


def _fail(rs: list, what: str, show) -> str:
    return f"{len(rs)} runs {what}; first:\n" + "\n".join(show(r) for r in rs[:4])


# ------------------------------------------------------------------------------------------- corpus


def test_scripted_builtins_are_in_the_corpus():
    b = h.scripted_builtins()
    assert b["tool"].startswith("I should look up the weather.</think>\n\n<｜DSML｜tool_calls>\n")
    assert b["tool_plain"].startswith("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">")
    assert b["reasoning"].count("</think>") == 1
    ids = {o.id for o in h.corpus()}
    assert {f"scripted:{k}" for k in b} <= ids


def test_parse_matches_reference(runs):
    """Our API body for every corpus output is byte-identical to the reference's."""
    bad = [r for r in runs if r.body != r.ref_body]
    assert not bad, _fail(bad, "parse unlike the reference",
                          lambda r: f"{r.key}\n ours {r.body[:700]}\n ref  {r.ref_body[:700]}")


def test_next_prompt_matches_reference(runs):
    """The re-rendered next prompt is byte-identical to the reference's (so every break below
    is the format's, not ours), and on V4 so are its token ids."""
    bad = [r for r in runs if r.p1 != r.ref_p1]
    assert not bad, _fail(bad, "render unlike the reference", lambda r: r.key)
    bad = [r for r in runs if r.has_ids and r.i1 != r.ref_i1]
    assert not bad, _fail(bad, "ids unlike the reference", lambda r: r.key)


def test_bytes_round_trip_exactly_where_the_format_allows(runs):
    """holds <=> the output has no format reason; a holding run also keeps P0 as a prefix."""
    unexpected_break = [r for r in runs if not r.holds_bytes and not r.expected]
    assert not unexpected_break, _fail(unexpected_break, "break without a known reason", h.Run.divergence)
    unexpected_hold = [r for r in runs if r.holds_bytes and r.expected]
    assert not unexpected_hold, _fail(unexpected_hold, "hold although expected to break",
                                      lambda r: f"{r.key} {sorted(r.expected)}")


def test_breaks_are_where_the_model_text_is_rewritten(runs):
    """Every break starts inside the generated text (never in the previous prompt), except the
    reasoning-drop rule, which rewrites the `<think>` that ends the previous prompt."""
    for r in runs:
        if r.holds_bytes:
            continue
        i = h.first_diff(r.want, r.p1)
        assert i >= len(r.p0), r.divergence()


def test_ids_round_trip_where_the_bytes_do(runs):
    """V4 ids: I1 starts with I0 + ids(generated) + EOS wherever the bytes hold, except where the
    model wrote a control-token string inside text (it is re-read as plain text)."""
    checked = [r for r in runs if r.has_ids and r.holds_bytes]
    assert len(checked) > 500
    for r in checked:
        assert r.i1[:len(r.i0)] == r.i0, r.key
        why = r.out.expected_id_reasons(r.thinking)
        assert r.holds_ids == (not why), (r.key, sorted(why))
    broken = [r for r in runs if r.has_ids and not r.holds_bytes]
    assert all(not r.holds_ids for r in broken)


# Measured on this corpus; docs/HISTORY-ROUNDTRIP.md quotes these numbers.  A corpus change
# changes them: update the doc with the test.
EXPECTED_COUNTS = {
    # (source, mode): (runs, bytes hold, ids checked (V4), ids hold)
    ("scripted", "think"): (36, 12, 18, 6),
    ("scripted", "plain"): (36, 30, 18, 15),
    ("generated", "think"): (918, 741, 459, 354),
    ("generated", "plain"): (906, 753, 453, 363),
}


def test_measured_counts(runs):
    got = {}
    for r in runs:
        k = (r.out.source, "think" if r.thinking else "plain")
        n, b, c, i = got.get(k, (0, 0, 0, 0))
        got[k] = (n + 1, b + r.holds_bytes, c + r.has_ids, i + (r.has_ids and r.holds_ids))
    print(json.dumps(h.summary(runs), indent=1, sort_keys=True))
    assert got == EXPECTED_COUNTS


# ----------------------------------------------------------------------------------- conversation rules


def test_reasoning_is_dropped_without_tools(deepinfer):
    """No tools declared, thinking on: the template renders earlier assistant turns as
    `</think>content`, so the `<think>` ending the previous prompt is rewritten and nothing of
    the answer is reused.  Thinking off: the answer round-trips."""
    outs = [o for o in h.corpus() if h.DSML not in o.text(True, "v4") and not o.expected_reasons(True, "v4")
            and not o.expected_reasons(False, "v4") and not o.id_only and not o.id_only_thinking]
    assert len(outs) >= 4
    runs = h.run_all(deepinfer, outs, tools_on=False, ids=False)
    for r in runs:
        assert r.p1 == r.ref_p1, r.key
        if not r.thinking:
            assert r.holds_bytes, r.divergence()
            continue
        assert not r.holds_bytes
        assert r.p0.endswith("<｜Assistant｜><think>")
        cut = len(r.p0) - len("<think>")
        assert r.p1[:cut] == r.p0[:cut]
        content = r.text.split("</think>", 1)[1]
        assert r.p1[cut:].startswith("</think>" + content + h.EOS), r.key


def _steps(deepinfer, api, enc, thinking, outs):
    """An agent loop: each output is parsed against the conversation so far and appended."""
    req = h.first_request(api, enc, thinking)
    with tempfile.TemporaryDirectory() as td:
        turns = []
        for k, o in enumerate(outs):
            text = o.text(thinking, enc)
            # call ids are random in real answers; deterministic ones would repeat across turns
            body_text = h.cli_parse(deepinfer, api, req, text, td, str(k))
            body = json.loads(body_text.replace("TESTTESTTESTTESTTEST0000", f"TURN{k}TESTTESTTESTTEST0000"[:24]))
            turns.append((req, text))
            req = h.next_request(api, req, body, k)
        turns.append((req, None))
    reqs = [t[0] for t in turns]
    prompts = [p["prompt"] for p in h.cli_render(deepinfer, api, enc, reqs)]
    ids = [p["ids"] for p in h.cli_render(deepinfer, api, enc, reqs, tokens=True)] if enc in h.ID_ENCODINGS else None
    return turns, prompts, ids


@pytest.mark.parametrize("api", h.APIS)
@pytest.mark.parametrize("enc", h.ENCODINGS)
@pytest.mark.parametrize("thinking", [True, False], ids=["think", "plain"])
def test_agent_loop(deepinfer, api, enc, thinking):
    """Three turns (call, call with reasoning and content, final answer): every prompt extends
    the previous one by exactly the generated text + EOS + the tool results."""
    by_id = {o.id: o for o in h.corpus()}
    outs = [by_id["gen:three-calls" if enc == "v4.1" else "gen:string-and-int"], by_id["gen:reasoning-and-content"],
            by_id["gen:content-multiline"]]
    turns, prompts, ids = _steps(deepinfer, api, enc, thinking, outs)
    gen_ids = h.cli_template_ids(deepinfer, [t for _, t in turns[:-1]]) if ids else None
    for k in range(len(outs)):
        want = prompts[k] + turns[k][1] + h.EOS
        assert prompts[k + 1].startswith(want), (k, prompts[k + 1][len(prompts[k]):][:300])
        assert h.ref_render(api, enc, turns[k + 1][0])["prompt"] == prompts[k + 1]
        if ids:
            w = ids[k] + gen_ids[k] + [h.EOS_ID]
            assert ids[k + 1][:len(w)] == w, k
    assert prompts[-1].startswith(prompts[0])


# ------------------------------------------------------------------------------------ client behaviour


def _tool_turn(deepinfer, api, enc, out_id="scripted:tool"):
    o = {x.id: x for x in h.corpus()}[out_id]
    req = h.first_request(api, enc, True)
    text = o.text(True, enc)
    with tempfile.TemporaryDirectory() as td:
        body = json.loads(h.cli_parse(deepinfer, api, req, text, td, "c"))
    p0 = h.cli_render(deepinfer, api, enc, [req])[0]["prompt"]
    return req, body, p0 + text + h.EOS


def _holds(deepinfer, api, enc, req1, want) -> bool:
    got = h.cli_render(deepinfer, api, enc, [req1])[0]["prompt"]
    assert got == h.ref_render(api, enc, req1)["prompt"]
    return got.startswith(want)


def _edit_chat(body, f):
    b = json.loads(json.dumps(body))
    f(b["choices"][0]["message"])
    return b


@pytest.mark.parametrize("enc", h.ENCODINGS)
def test_client_rules_chat(deepinfer, enc):
    """What a Chat client may and may not change in the assistant message it sends back."""
    req, body, want = _tool_turn(deepinfer, "chat", enc)
    nxt = lambda b: h.next_request("chat", req, b)  # noqa: E731
    assert _holds(deepinfer, "chat", enc, nxt(body), want)
    keep = {
        "content null": lambda m: m.update(content=None),
        "no index on tool_calls": lambda m: [tc.pop("index") for tc in m["tool_calls"]],
        "arguments re-serialized (Python)": lambda m: [tc["function"].update(
            arguments=json.dumps(json.loads(tc["function"]["arguments"]))) for tc in m["tool_calls"]],
        "arguments re-serialized compactly": lambda m: [tc["function"].update(
            arguments=json.dumps(json.loads(tc["function"]["arguments"]), separators=(",", ":")))
            for tc in m["tool_calls"]],
    }
    for name, f in keep.items():
        assert _holds(deepinfer, "chat", enc, nxt(_edit_chat(body, f)), want), name
    lose = {
        "reasoning_content dropped": lambda m: m.pop("reasoning_content"),
        "reasoning_content changed": lambda m: m.update(reasoning_content=m["reasoning_content"] + "\n"),
        "arguments keys reordered": lambda m: [tc["function"].update(arguments=json.dumps(
            dict(reversed(list(json.loads(tc["function"]["arguments"]).items()))))) for tc in m["tool_calls"]],
    }
    for name, f in lose.items():
        assert not _holds(deepinfer, "chat", enc, nxt(_edit_chat(body, f)), want), name
    # a JavaScript client (JSON.stringify(JSON.parse(arguments))) turns 1.0 into 1
    req2, body2, want2 = _tool_turn(deepinfer, "chat", enc, "gen:nonstring-6")
    tcs = body2["choices"][0]["message"]["tool_calls"]
    assert tcs[0]["function"]["arguments"] == '{"cmd": "ls", "args": 1.0}'
    js = _edit_chat(body2, lambda m: m["tool_calls"][0]["function"].update(arguments='{"cmd":"ls","args":1}'))
    assert _holds(deepinfer, "chat", enc, h.next_request("chat", req2, body2), want2)
    assert not _holds(deepinfer, "chat", enc, h.next_request("chat", req2, js), want2)


@pytest.mark.parametrize("enc", h.ENCODINGS)
def test_client_rules_responses_and_messages(deepinfer, enc):
    """Responses: output items go back as they came (reasoning item included); Messages: the
    content blocks go back as they came (thinking block included)."""
    req, body, want = _tool_turn(deepinfer, "responses", enc)
    assert _holds(deepinfer, "responses", enc, h.next_request("responses", req, body), want)
    bare = json.loads(json.dumps(body))
    for it in bare["output"]:  # ids / status / phase are not needed
        for k in ("id", "status", "phase", "encrypted_content", "summary"):
            it.pop(k, None)
    assert _holds(deepinfer, "responses", enc, h.next_request("responses", req, bare), want)
    no_reasoning = dict(body, output=[it for it in body["output"] if it["type"] != "reasoning"])
    assert not _holds(deepinfer, "responses", enc, h.next_request("responses", req, no_reasoning), want)

    req, body, want = _tool_turn(deepinfer, "messages", enc)
    assert _holds(deepinfer, "messages", enc, h.next_request("messages", req, body), want)
    no_thinking = dict(body, content=[b for b in body["content"] if b["type"] != "thinking"])
    assert not _holds(deepinfer, "messages", enc, h.next_request("messages", req, no_thinking), want)


# ------------------------------------------------------------------------------------- other shapes


FORCED = {
    "chat": [{"tool_choice": "required"}, {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}],
    "responses": [{"tool_choice": "required"}, {"tool_choice": {"type": "function", "name": "get_weather"}}],
    "messages": [{"tool_choice": {"type": "tool", "name": "get_weather"}}],
}


@pytest.mark.parametrize("api", h.APIS)
@pytest.mark.parametrize("enc", h.ENCODINGS)
def test_forced_tool_choice(deepinfer, api, enc):
    """A forced tool call: the prompt ends in `\\n\\n<｜DSML｜B>\\n` and the model writes the rest of
    the block; the re-rendered turn is the prompt's prefix + that rest, also in ids."""
    b, _, _ = h.spelling(enc)
    o = {x.id: x for x in h.corpus()}["gen:string-and-int"]
    full = o.text(False, enc)
    head = f"\n\n<{h.DSML}{b}>\n"
    assert full.startswith(head)
    text = full[len(head):]
    pairs = []
    with tempfile.TemporaryDirectory() as td:
        for q, extra in enumerate(FORCED[api]):
            req = dict(h.first_request(api, enc, False), **extra)
            body_text = h.cli_parse(deepinfer, api, req, text, td, str(q))
            assert body_text == h.ref_parse(api, req, text)
            pairs += [req, h.next_request(api, req, json.loads(body_text))]
    prompts = [p["prompt"] for p in h.cli_render(deepinfer, api, enc, pairs)]
    ids = [p["ids"] for p in h.cli_render(deepinfer, api, enc, pairs, tokens=True)] if enc in h.ID_ENCODINGS else None
    gen = h.cli_template_ids(deepinfer, [text])[0] + [h.EOS_ID] if ids else None
    for q in range(0, len(pairs), 2):
        p0, p1 = prompts[q], prompts[q + 1]
        assert p0.endswith("<｜Assistant｜></think>" + head)
        assert p1 == h.ref_render(api, enc, pairs[q + 1])["prompt"]
        assert p1.startswith(p0 + text + h.EOS), pairs[q]
        if ids:
            w = ids[q] + gen
            assert ids[q + 1][:len(w)] == w, pairs[q]


@pytest.mark.parametrize("enc", h.ENCODINGS)
def test_json_mode(deepinfer, enc):
    """JSON mode (Chat json_object): a bare JSON answer round-trips; text around it (a fence) is
    turned into spaces by the parser, in the reference too."""
    req = dict(h.first_request("chat", enc, False), response_format={"type": "json_object"})
    req["messages"][-1]["content"] = "Answer in JSON."
    for text, holds in (('{"a": 1, "b": [true]}', True), ('```json\n{"a": 1}\n```', False)):
        with tempfile.TemporaryDirectory() as td:
            body_text = h.cli_parse(deepinfer, "chat", req, text, td, "j")
        assert body_text == h.ref_parse("chat", req, text)
        req1 = h.next_request("chat", req, json.loads(body_text))
        p0, p1 = (p["prompt"] for p in h.cli_render(deepinfer, "chat", enc, [req, req1]))
        assert p1 == h.ref_render("chat", enc, req1)["prompt"]
        assert p1.startswith(p0 + text + h.EOS) == holds, text


# ------------------------------------------------------------------- Responses custom tool (apply_patch)


CUSTOM_REQ = {"model": "DeepSeek-V4.1-Flash", "input": [{"role": "user", "content": "patch it"}],
              "reasoning": {"effort": "none"},
              "tools": [{"type": "custom", "name": "apply_patch"},
                        {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]}
_PIECES = ["a", "é", "😀", '"', "\\", "\\n", '\\"', "\\\\", "\\/", "\\u", "\\u00", "\\u0041", "\\ud83d", "\\ude00",
           "\\uD83D\\uDE00", "\\ud83d\\ude00", "\\x", "\\U", "G", "}", " ", "\n", "\t", "{", "1", "\\u12G4",
           "\\b\\f\\r\\t", "\x01", "\\u0000"]


def _custom_output(rng: random.Random) -> tuple[str, str]:
    params = []
    for _ in range(rng.choice([1, 1, 1, 2])):
        name = rng.choice(["input", "input", "input", "x", "inp"])
        string = rng.random() < 0.3
        v = "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 8)))
        if not string:  # a raw JSON value: usually a string literal, sometimes not
            v = rng.choice(['"', '"', '"', ' "', '\n"', '\t "', "x", "1"]) + v + rng.choice(['"', '"', "", '" junk'])
        params.append(f'<｜DSML｜ parameter name="{name}" string="{"true" if string else "false"}">'
                      f'{v}</｜DSML｜ parameter>')
    t = ('\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="apply_patch">\n' + "\n".join(params)
         + "\n</｜DSML｜ invoke>")
    if rng.random() < 0.2:
        t += '\n<｜DSML｜ invoke name="f">\n</｜DSML｜ invoke>'
    t += "\n</｜DSML｜ calls>"
    if rng.random() < 0.25:
        return t[:rng.randint(len(t) // 3, len(t))], "length"
    return t, "stop"


def test_responses_custom_tool_input_matches_reference(deepinfer, tmp_path):
    """The apply_patch `input` decoder: string="false" values arrive as raw JSON, split anywhere,
    with escapes, surrogate pairs and broken escapes; events and body equal the reference's.
    (Before the fix a raw JSON string value came back as `{"input": "..."}` text, and an escape
    split across chunks stayed escaped.)"""
    rng = random.Random(20261130)
    bad = []
    for i in range(70):
        text, finish = _custom_output(rng)
        for chunks in stream_gen.chunkings(text, i, 3):
            for stream in (True, False):
                want = stream_oracle_responses.parse_responses(CUSTOM_REQ, chunks, stream=stream, prompt_tokens=3,
                                                               cached_tokens=1, finish=finish)
                path = tmp_path / "req.json"
                path.write_text(json.dumps(dict(CUSTOM_REQ, stream=stream)), encoding="utf-8")
                p = subprocess.run([deepinfer, "recipe", "parse", "--api", "responses", "--request", str(path),
                                    "--deterministic", "--prompt-tokens", "3", "--cached-tokens", "1",
                                    "--finish", finish] + (["--stream"] if stream else []),
                                   input="".join(json.dumps(c, ensure_ascii=False) + "\n" for c in chunks).encode(),
                                   capture_output=True, timeout=60)
                assert p.returncode == 0, p.stderr.decode()
                if p.stdout.decode("utf-8", "replace") != want:
                    bad.append((text, chunks, stream))
    assert not bad, f"{len(bad)} differ; first: {bad[0]!r}"[:3000]


@pytest.mark.parametrize("enc", h.ENCODINGS)
@pytest.mark.parametrize("thinking", [True, False], ids=["think", "plain"])
def test_custom_tool_round_trip(deepinfer, enc, thinking):
    """apply_patch + a namespaced function: `custom_tool_call.input` and the flattened name go
    back as returned and re-render to the generated block."""
    b, c, p = h.spelling(enc)
    ns = "fs__read" if enc == "v4" else "fs::read"
    patch = '*** Begin Patch\n*** Add File: a.txt\n+Hello, "世界" 😀 \\n\t\x01\n*** End Patch'
    text = (("Patch it.</think>" if thinking else "") +
            f'\n\n<{h.DSML}{b}>\n<{h.DSML}{c} name="apply_patch">\n<{h.DSML}{p} name="input" string="true">{patch}'
            f'</{h.DSML}{p}>\n</{h.DSML}{c}>\n<{h.DSML}{c} name="{ns}">\n<{h.DSML}{p} name="p" string="true">a.txt'
            f'</{h.DSML}{p}>\n</{h.DSML}{c}>\n</{h.DSML}{b}>')
    req = {"model": h.MODELS[enc], "input": [{"role": "user", "content": "patch it"}],
           "reasoning": {"effort": "high" if thinking else "none"},
           "tools": [{"type": "custom", "name": "apply_patch"},
                     {"type": "namespace", "name": "fs", "description": "Files", "tools": [
                         {"type": "function", "name": "read", "description": "Read",
                          "parameters": {"type": "object", "properties": {"p": {"type": "string"}}}}]}]}
    with tempfile.TemporaryDirectory() as td:
        body_text = h.cli_parse(deepinfer, "responses", req, text, td, "p")
    assert body_text == h.ref_parse("responses", req, text)
    body = json.loads(body_text)
    assert [it["type"] for it in body["output"]][-2:] == ["custom_tool_call", "function_call"]
    assert body["output"][-2]["input"] == patch
    req1 = h.next_request("responses", req, body)
    p0, p1 = (x["prompt"] for x in h.cli_render(deepinfer, "responses", enc, [req, req1]))
    assert p1 == h.ref_render("responses", enc, req1)["prompt"]
    assert p1.startswith(p0 + text + h.EOS)


# ------------------------------------------------------------------------------------------ U+0000


def test_nul_in_a_string_parameter(deepinfer):
    """A U+0000 the model wrote inside a parameter value comes back as `\\u0000` in the arguments
    JSON; the renderer must take it as a character (it used to reject the JSON and fall back to
    one `arguments` parameter, unlike the reference)."""
    o = h.Out("nul", "generated", calls=[h.Call("write_file", [
        h.S("content", "a\x00b"), h.N("meta", '{"n": "a\\u0000b", "m": ["\\u0000"]}')])])
    runs = h.run_all(deepinfer, [o], apis=("chat", "responses"))
    for r in runs:
        assert r.body == r.ref_body and r.p1 == r.ref_p1, r.key
        assert r.holds_bytes, r.divergence()
        if r.has_ids:
            assert r.holds_ids and r.i1 == r.ref_i1, r.key


@pytest.mark.xfail(strict=True, reason="request side (src/server/api.c, tools/cmd_recipe.c): a body holding "
                   "U+0000 is rejected with 400; the reference accepts it (docs/HISTORY-ROUNDTRIP.md)")
def test_nul_in_content_can_be_sent_back(deepinfer):
    o = h.Out("nul-content", "generated", reasoning="r", content="x\x00y")
    h.run_all(deepinfer, [o], apis=("chat",), encs=("v4",), reference=False, ids=False)


@pytest.mark.xfail(strict=True, reason="arguments nested 128 levels or deeper: the reference's JSON parser gives "
                   "up and renders one `arguments` parameter, ours renders the value (docs/HISTORY-ROUNDTRIP.md)")
def test_deep_arguments_render_like_reference(deepinfer):
    deep = "[" * 127 + "]" * 127
    o = h.Out("deep", "generated", calls=[h.Call("run", [h.N("args", deep)])])
    runs = h.run_all(deepinfer, [o], apis=("chat",), encs=("v4",), modes=(False,), ids=False)
    assert runs[0].p1 == runs[0].ref_p1


def test_more_than_100_calls(deepinfer):
    """Call ids are `call_{k:02d}_…` (as the reference's): from k = 100 on they no longer sort in
    call order, and V4 (sorts an assistant's calls by id) and Responses (sorts each call group
    by call_id) reorder them; the reference does the same.  Up to 100 calls the order holds."""
    o = h.Out("many", "generated", calls=[h.Call("get_weather", [h.S("city", f"C{k}")]) for k in range(101)])
    runs = h.run_all(deepinfer, [o], modes=(False,), ids=False)
    for r in runs:
        assert r.body == r.ref_body and r.p1 == r.ref_p1, r.key
        assert r.holds_bytes == (r.enc == "v4.1" and r.api != "responses"), r.key
        if not r.holds_bytes:
            i = h.first_diff(r.want, r.p1)
            assert r.p1[i - 3:i + 1] == "C100", r.divergence()
