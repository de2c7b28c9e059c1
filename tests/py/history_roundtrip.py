"""History round trip: model output -> API message -> next prompt (docs/HISTORY-ROUNDTRIP.md).

The prefix KV cache hits on turn k+1 only if the next prompt starts with
``prompt_k + generated_text + EOS``, byte for byte and then id for id.  This
module builds the corpus and runs one round trip per (output, thinking, api,
encoding):

    R0 (user turn + tools)  --render-->  P0, I0
    generated text (no EOS) --deepinfer recipe parse--> API body
    R1 = R0 + the body's assistant message as returned + one tool result per call
         (a user message when there is no call)  --render-->  P1, I1
    holds (bytes)  <=> P1.startswith(P0 + text + EOS)
    holds (ids)    <=> I1 starts with I0 + template_ids(text) + [EOS]

``template_ids`` tokenizes the generated text with added tokens recognised: that is
what the model emits (``</think>``, ``｜DSML｜`` and EOS are single control ids; the
scripted backend stores its scripts the same way).

Every output carries the reasons it is expected *not* to round trip (``Out.reasons``);
each reason is a property of the DSML / chat-template format itself, and the test checks
that deepseek-recipe 0.2.0 renders exactly the same next prompt, so none of them is ours
to "fix".  The reference runs in-process: ``stream_oracle*`` (parser) and
``recipe_oracle`` (renderer, ids).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import pathlib
import random
import re
import subprocess
import tempfile

import recipe_oracle
import stream_oracle
import stream_oracle_messages
import stream_oracle_responses

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = {"v4": "DeepSeek-V4-Pro", "v4.1": "DeepSeek-V4.1-Flash"}
EOS = "<｜end▁of▁sentence｜>"
EOS_ID = 1
DSML = "｜DSML｜"
APIS = ("chat", "responses", "messages")
ENCODINGS = ("v4", "v4.1")
# ids only where a tokenizer.json exists: the bundled one is V4's (it has no <｜System｜>, so
# V4.1 prompts cannot be tokenized by either side; tests/py/test_recipe_tokens_diff.py)
ID_ENCODINGS = ("v4",)

# --------------------------------------------------------------------------------------------- tools

TOOLS = {
    "get_weather": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "search": {"query": {"type": "string"}, "limit": {"type": "integer"}, "filters": {"type": "object"}},
    "write_file": {"path": {"type": "string"}, "content": {"type": "string"}},
    "run": {"cmd": {"type": "string"}, "args": {"type": "array"}, "env": {"type": "object"},
            "timeout": {"type": "number"}, "check": {"type": "boolean"}},
    "noop": {},
}


def _schema(props: dict) -> dict:
    return {"type": "object", "properties": props}


# --------------------------------------------------------------------------------------------- outputs


def spelling(enc: str) -> tuple[str, str, str]:
    """DSML block / call / parameter tag names (spec §1.3)."""
    return ("tool_calls", "invoke", "parameter") if enc == "v4" else (" calls", " invoke", " parameter")


@dataclasses.dataclass
class Param:
    name: str
    string: bool
    raw: str  # the text between `string="...">` and `</｜DSML｜parameter>`, as the model writes it


@dataclasses.dataclass
class Call:
    name: str
    params: list[Param]


@dataclasses.dataclass
class Out:
    """One model output.  ``text(thinking, enc)`` is what the model generated after the prompt
    (after ``<think>`` or ``</think>``), without EOS."""

    id: str
    source: str  # "scripted" | "generated"
    reasoning: str = ""  # thinking mode: text before </think>
    content: str = ""
    calls: list[Call] = dataclasses.field(default_factory=list)
    sep: str = "\n\n"  # between content and the DSML block
    close_think: bool = True  # thinking mode: the model writes </think> before content / block
    tail: str = ""  # text after the block close (before EOS)
    empty_call_blank: bool = True  # an argument-less call is written `name="f">\n\n</…invoke>`
    dsml_ws: tuple[str, str, str, str] = ("\n", "\n", "\n", "\n")  # after block open, after invoke
    # open, between parameters, before invoke close; "\n" each in the canonical format
    reasons: frozenset = frozenset()  # format reasons the round trip does not hold (both modes)
    reasons_thinking: frozenset = frozenset()  # ... only in thinking mode
    reasons_plain: frozenset = frozenset()  # ... only in non-thinking mode
    reasons_v4: frozenset = frozenset()  # ... only with the V4 encoding
    reasons_v41: frozenset = frozenset()  # ... only with the V4.1 encoding
    id_only: frozenset = frozenset()  # bytes hold, ids do not (control-token text, see doc)
    id_only_thinking: frozenset = frozenset()  # ... only in thinking mode
    raw: dict | None = None  # scripted: {"thinking": text, "plain": text} in V4 spelling
    modes: tuple = (True, False)  # thinking modes the output belongs to

    def block(self, enc: str) -> str:
        b, c, p = spelling(enc)
        w_open, w_inv, w_par, w_close = self.dsml_ws
        calls = []
        for call in self.calls:
            params = [f'<{DSML}{p} name="{q.name}" string="{"true" if q.string else "false"}">{q.raw}</{DSML}{p}>'
                      for q in call.params]
            if params:
                body = w_inv + w_par.join(params) + w_close
            else:
                body = "\n\n" if self.empty_call_blank else "\n"
            calls.append(f'<{DSML}{c} name="{call.name}">{body}</{DSML}{c}>')
        return f"<{DSML}{b}>{w_open}" + "\n".join(calls) + f"\n</{DSML}{b}>"

    def text(self, thinking: bool, enc: str) -> str:
        if self.raw is not None:
            t = self.raw["thinking" if thinking else "plain"]
            return respell(t, enc)
        t = ""
        if thinking:
            t += self.reasoning + ("</think>" if self.close_think else "")
        t += self.content
        if self.calls:
            t += self.sep + self.block(enc)
        return t + self.tail

    def expected_reasons(self, thinking: bool, enc: str, tools_on: bool = True) -> set[str]:
        r = set(self.reasons)
        r |= self.reasons_thinking if thinking else self.reasons_plain
        r |= self.reasons_v4 if enc == "v4" else self.reasons_v41
        if thinking and not tools_on:
            r.add("reasoning-dropped-without-tools")
        return r

    def expected_id_reasons(self, thinking: bool) -> set[str]:
        """Reasons the ids break although the bytes hold."""
        return set(self.id_only) | (set(self.id_only_thinking) if thinking else set())


def respell(text: str, enc: str) -> str:
    """V4 DSML spelling -> the one of ``enc``."""
    if enc == "v4":
        return text
    for old, new in (("tool_calls>", " calls>"), ("invoke", " invoke"), ("parameter", " parameter")):
        text = text.replace(f"{DSML}{old}", f"{DSML}{new}")
    return text


# ---- the scripted backend's built-in outputs, read from its source so the test follows it


def _c_string(lits: str) -> str:
    """Concatenate adjacent C string literals (\\xHH, \\n, \\", \\\\ escapes) into a Python str."""
    out = bytearray()
    for lit in re.findall(r'"((?:[^"\\]|\\.)*)"', lits):
        i = 0
        while i < len(lit):
            ch = lit[i]
            if ch != "\\":
                out += ch.encode("utf-8")
                i += 1
                continue
            e = lit[i + 1]
            if e == "x":
                m = re.match(r"[0-9A-Fa-f]+", lit[i + 2:])
                out.append(int(m.group(0), 16))
                i += 2 + len(m.group(0))
                continue
            out += {"n": b"\n", "t": b"\t", '"': b'"', "\\": b"\\", "r": b"\r"}[e]
            i += 2
    return out.decode("utf-8")


def scripted_builtins() -> dict[str, str]:
    src = (ROOT / "src" / "engine" / "scripted.c").read_text(encoding="utf-8")
    m = re.search(r"BUILTIN\[\]\[2\]\s*=\s*\{(.*?)\n\};", src, re.S)
    assert m, "scripted.c: BUILTIN table not found"
    out = {}
    for name, lits in re.findall(r'\{"(\w+)",\s*((?:"(?:[^"\\]|\\.)*"\s*)+)\}', m.group(1)):
        out[name] = _c_string(lits)
    assert {"hello", "reasoning", "tool", "tool_plain"} <= set(out), sorted(out)
    return out


def scripted_outputs() -> list[Out]:
    """What the scripted backend generates: a thinking prompt replays the whole script, a
    non-thinking one (ending in </think>) what follows the script's first </think>."""
    outs = []
    for name, script in scripted_builtins().items():
        plain = script.split("</think>", 1)[1] if "</think>" in script else script
        o = Out(id=f"scripted:{name}", source="scripted", raw={"thinking": script, "plain": plain})
        if "</think>" not in script:
            # the whole script is reasoning in thinking mode: the model never closed it
            o.reasons_thinking = frozenset({"reasoning-not-closed"})
        if script.startswith(f"<{DSML}"):
            # DSML straight after the prompt: the renderer writes "\n\n" (and, thinking, </think>)
            o.reasons_plain = frozenset({"block-not-after-blank-line"})
        outs.append(o)
    return outs


# ---- generated corpus

S = lambda name, raw: Param(name, True, raw)  # noqa: E731
N = lambda name, raw: Param(name, False, raw)  # noqa: E731

STRINGS = [
    "Paris", "New York", 'He said "hi"', "line one\nline two\n", "a < b && c > d", "<b>bold</b> &amp;",
    "tab\there", "back\\slash \\n literal", "日本語のテキスト 🌍", "", "  padded  ", '{"looks": "like json"}',
    "42", "true", "null", "ctl\x01char", "del\x7f u2028\u2028 nbsp\u00a0", "crlf\r\nline",
    "/path/to/file.txt", "```python\nprint('x')\n```", "ends with newline\n", "\n", "</thinking> <｜ x",
]
# canonical pyjson text of non-string values (what the renderer writes back); floats that
# print alike in both encodings' styles
NONSTRINGS = [
    "0", "-7", "3", "123456789", "3.5", "-0.25", "1.0", "1e+16", "true", "false", "null", "[]", "{}",
    "[1, 2, 3]", '{"a": 1, "b": [true, null]}', '{"名": "值", "emoji": "😀"}', '{"q": "say \\"hi\\"\\nbye"}',
    '[{"a": []}, {}, [[]]]', '{"deep": {"er": {"est": [1.5, "x"]}}}', '["a < b", "</x>"]', "-9223372036854775808",
    '{"z": 1, "a": 2}',
]
CONTENTS = ["Sure.", "Let me check that for you.", "Checking two things:\n- the weather\n- the news",
            "Okay 👍 — on it", "Running it now. "]
REASONINGS = ["The user wants the weather.", "First, find the file.\n\nThen write it.",
              "需要查询天气。", "Compare a < b; call the tool with \"quotes\".", "Plan:\n1. search\n2. answer"]


def _rand_call(rng: random.Random) -> Call:
    name = rng.choice([n for n in TOOLS if n != "noop"])
    keys = list(TOOLS[name]) + ["extra", "名字", "k-2"]
    params = []
    for key in rng.sample(keys, rng.randint(1, min(4, len(keys)))):
        if rng.random() < 0.5:
            params.append(S(key, rng.choice(STRINGS)))
        else:
            params.append(N(key, rng.choice(NONSTRINGS)))
    return Call(name, params)


def generated_outputs(seed: int = 20261129, n_random: int = 60) -> list[Out]:
    """Hand-written feature cases (each names what it exercises), then ``n_random`` random
    canonical tool-call outputs.  Reasons list what the format itself does not keep."""
    w = Call("get_weather", [S("city", "Paris")])
    w2 = Call("get_weather", [S("city", "Paris"), N("days", "3")])
    outs: list[Out] = []

    def add(id_: str, **kw):
        outs.append(Out(id=f"gen:{id_}", source="generated", **kw))

    # --- canonical: round trip must hold
    add("one-call", calls=[w])
    add("string-and-int", calls=[w2])
    add("three-calls", calls=[w2, Call("search", [S("query", "news"), N("limit", "5")]), Call("noop", [])],
        reasons_v4=frozenset({"empty-call-spelling"}))
    add("twelve-calls", calls=[Call("get_weather", [S("city", f"City {k}"), N("days", str(k))]) for k in range(12)])
    for k, s in enumerate(STRINGS):
        add(f"string-{k}", calls=[Call("write_file", [S("path", "a.txt"), S("content", s)])])
    for k, v in enumerate(NONSTRINGS):
        add(f"nonstring-{k}", calls=[Call("run", [S("cmd", "ls"), N("args", v)])])
    # floats below 1e-4: V4.1 writes Python repr (1e-05), V4 positional (0.00001)
    add("float-small-py", calls=[Call("run", [N("timeout", "1e-05")])], reasons_v4=frozenset({"non-canonical-json"}))
    add("float-small-v4", calls=[Call("run", [N("timeout", "0.00001")])],
        reasons_v41=frozenset({"non-canonical-json"}))
    add("big-u64", calls=[Call("run", [N("timeout", "12345678901234567890")])])
    add("reasoning-and-content", reasoning=REASONINGS[1], content="I'll write the file.", calls=[w2])
    add("unicode-param-name", calls=[Call("run", [S("名字", "值"), N("k-2", "[1]")])])
    add("content-only", content="The weather in Paris is sunny.")
    add("content-multiline", reasoning="Think.", content="Para one.\n\nPara two:\n- a\n- b\n")
    add("content-trailing-newlines", reasoning="r", content="Done.\n\n")
    add("content-with-lt", reasoning="r", content="Use a < b and <tag>.")
    add("empty-reasoning-call", reasoning="", calls=[w])  # thinking: `</think>\n\n<｜DSML｜…`
    # an argument-less call: V4.1 renders a blank line inside the invoke, V4 does not
    add("empty-call-blank-line", calls=[Call("noop", [])], reasons_v4=frozenset({"empty-call-spelling"}))
    add("empty-call-no-blank-line", calls=[Call("noop", [])], empty_call_blank=False,
        reasons_v41=frozenset({"empty-call-spelling"}))
    # control-token strings inside text the model wrote: bytes round trip, ids cannot (the
    # renderer writes request text as plain text: injection safety, docs/RECIPE.md)
    ctl = frozenset({"control-token-text-in-history"})
    add("special-token-in-string", calls=[Call("write_file", [S("content", "say <｜User｜> or <think>")])],
        id_only=ctl)
    add("think-close-in-string", calls=[Call("write_file", [S("content", "a </think> b")])], id_only=ctl)
    add("dsml-open-in-string", calls=[Call("write_file", [S("content", "a <｜DSML｜ b")])], id_only=ctl)
    add("special-token-in-content", reasoning="r", content="The tag <think> opens reasoning.", id_only=ctl)
    add("special-token-in-reasoning", reasoning="The prompt ends with <｜Assistant｜>.", content="ok",
        id_only_thinking=ctl)

    # --- format: round trip cannot hold (the reference renders the same next prompt)
    add("json-compact-object", calls=[Call("run", [N("env", '{"A":"1","B":2}')])],
        reasons=frozenset({"non-canonical-json"}))
    add("json-compact-array", calls=[Call("run", [N("args", "[1,2,3]")])], reasons=frozenset({"non-canonical-json"}))
    add("json-number-1.50", calls=[Call("run", [N("timeout", "1.50")])], reasons=frozenset({"non-canonical-json"}))
    add("json-number-1E5", calls=[Call("run", [N("timeout", "1E5")])], reasons=frozenset({"non-canonical-json"}))
    add("json-number-minus-0", calls=[Call("run", [N("timeout", "-0")])], reasons=frozenset({"non-canonical-json"}))
    add("json-space-around", calls=[Call("run", [N("timeout", " 3 ")])], reasons=frozenset({"non-canonical-json"}))
    add("json-escaped-unicode", calls=[Call("run", [N("env", '{"s": "\\u00e9"}')])],
        reasons=frozenset({"non-canonical-json"}))
    add("json-escaped-slash", calls=[Call("run", [N("env", '{"s": "a\\/b"}')])],
        reasons=frozenset({"non-canonical-json"}))
    add("json-duplicate-key", calls=[Call("run", [N("env", '{"a": 1, "a": 2}')])],
        reasons=frozenset({"duplicate-key"}))
    add("string-false-json-string", calls=[Call("get_weather", [N("city", '"Paris"')])],
        reasons=frozenset({"string-false-for-a-string"}))
    add("duplicate-parameter", calls=[Call("get_weather", [S("city", "Paris"), S("city", "Rome")])],
        reasons=frozenset({"duplicate-key"}))
    add("invalid-json-value", calls=[Call("run", [S("cmd", "ls"), N("args", "not json")])],
        reasons=frozenset({"invalid-json-value"}))
    add("sep-one-newline", content="Sure.", sep="\n", calls=[w], reasons=frozenset({"block-not-after-blank-line"}))
    add("sep-three-newlines", content="Sure.", sep="\n\n\n", calls=[w],
        reasons=frozenset({"block-not-after-blank-line"}))
    add("sep-none", content="Sure.", sep="", calls=[w], reasons=frozenset({"block-not-after-blank-line"}))
    add("sep-none-no-content", sep="", calls=[w], reasons=frozenset({"block-not-after-blank-line"}))
    add("dsml-no-newlines", calls=[w2], dsml_ws=("", "", "", ""), reasons=frozenset({"dsml-whitespace"}))
    add("dsml-blank-lines", calls=[w2], dsml_ws=("\n", "\n", "\n\n", "\n"), reasons=frozenset({"dsml-whitespace"}))
    add("text-after-block", calls=[w], tail="\nDone.", reasons=frozenset({"text-after-block"}))
    add("newline-after-block", calls=[w], tail="\n", reasons=frozenset({"text-after-block"}))
    add("content-leading-newlines", reasoning="r", content="\n\nHello.",
        reasons=frozenset({"content-leading-newlines"}))
    add("reasoning-trailing-newline", reasoning="Think.\n", content="Hi.",
        reasons_thinking=frozenset({"reasoning-newlines"}))
    add("reasoning-leading-newline", reasoning="\nThink.", content="Hi.",
        reasons_thinking=frozenset({"reasoning-newlines"}))
    add("call-from-reasoning", reasoning="I need the weather.", close_think=False, calls=[w],
        reasons_thinking=frozenset({"reasoning-not-closed"}), modes=(True,))
    add("reasoning-not-closed", reasoning="Still thinking", close_think=False,
        reasons_thinking=frozenset({"reasoning-not-closed"}), modes=(True,))
    add("stray-think-close", reasoning="r", content="a</think>b", reasons=frozenset({"stray-think-close"}))
    add("param-name-with-space", calls=[Call("run", [S("my arg", "x")])], reasons=frozenset({"parameter-name"}))

    # --- random canonical combinations
    rng = random.Random(seed)
    for k in range(n_random):
        calls = [_rand_call(rng) for _ in range(rng.choice([1, 1, 2, 3, 4]))]
        add(f"random-{k}", reasoning=rng.choice(REASONINGS + [""]),
            content=rng.choice(CONTENTS + ["", ""]), calls=calls)
    return outs


def corpus() -> list[Out]:
    return scripted_outputs() + generated_outputs()


# --------------------------------------------------------------------------------------------- requests


def first_request(api: str, enc: str, thinking: bool, tools_on: bool = True) -> dict:
    """Turn 1: a system and a user message, every corpus tool declared."""
    model = MODELS[enc]
    if api == "chat":
        r = {"model": model, "messages": [{"role": "system", "content": "You are a careful agent."},
                                          {"role": "user", "content": "Do the task."}],
             "thinking": {"type": "enabled" if thinking else "disabled"}}
        if tools_on:
            r["tools"] = [{"type": "function", "function": {"name": n, "description": f"Tool {n}",
                                                            "parameters": _schema(p)}} for n, p in TOOLS.items()]
        return r
    if api == "responses":
        r = {"model": model, "instructions": "You are a careful agent.",
             "input": [{"role": "user", "content": "Do the task."}],
             "reasoning": {"effort": "high" if thinking else "none"}}
        if tools_on:
            r["tools"] = [{"type": "function", "name": n, "description": f"Tool {n}", "parameters": _schema(p)}
                          for n, p in TOOLS.items()]
        return r
    r = {"model": model, "max_tokens": 4096, "system": "You are a careful agent.",
         "messages": [{"role": "user", "content": "Do the task."}],
         "thinking": {"type": "enabled", "budget_tokens": 2048} if thinking else {"type": "disabled"}}
    if tools_on:
        r["tools"] = [{"name": n, "description": f"Tool {n}", "input_schema": _schema(p)} for n, p in TOOLS.items()]
    return r


def next_request(api: str, req: dict, body: dict, k: int = 0) -> dict:
    """``req`` + the assistant turn exactly as the API returned it + tool results (or a user turn)."""
    nxt = json.loads(json.dumps(req))
    if api == "chat":
        msg = body["choices"][0]["message"]
        nxt["messages"].append(msg)
        calls = msg.get("tool_calls") or []
        for q, tc in enumerate(calls):
            nxt["messages"].append({"role": "tool", "tool_call_id": tc["id"], "content": f"result {k}.{q}"})
        if not calls:
            nxt["messages"].append({"role": "user", "content": f"Thanks ({k})."})
        return nxt
    if api == "responses":
        items = body["output"]
        nxt["input"] = list(nxt["input"]) + items
        calls = [it for it in items if it["type"] in ("function_call", "custom_tool_call")]
        for q, it in enumerate(calls):
            nxt["input"].append({"type": it["type"] + "_output", "call_id": it["call_id"], "output": f"result {k}.{q}"})
        if not calls:
            nxt["input"].append({"role": "user", "content": f"Thanks ({k})."})
        return nxt
    content = body["content"]
    nxt["messages"].append({"role": "assistant", "content": content})
    uses = [b for b in content if b["type"] == "tool_use"]
    if uses:
        nxt["messages"].append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b["id"], "content": f"result {k}.{q}"} for q, b in enumerate(uses)]})
    else:
        nxt["messages"].append({"role": "user", "content": f"Thanks ({k})."})
    return nxt


# --------------------------------------------------------------------------------------------- runners


def _lines(objs: list) -> bytes:
    return "".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objs).encode("utf-8")


def _jsonl_out(proc: subprocess.CompletedProcess, n: int) -> list:
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")[-2000:]
    out = proc.stdout.decode("utf-8").split("\n")
    assert out[-1] == "" and len(out) == n + 1, f"{len(out) - 1} lines for {n} inputs"
    return [json.loads(x) for x in out[:-1]]


def cli_render(deepinfer: str, api: str, enc: str, reqs: list[dict], tokens: bool = False) -> list[dict]:
    """{"prompt": ...} or {"ids": [...]} per request (``deepinfer recipe render|tokens --jsonl``)."""
    proc = subprocess.run([deepinfer, "recipe", "tokens" if tokens else "render", "--api", api,
                           "--encoding", enc, "--jsonl"], input=_lines(reqs), capture_output=True, timeout=300)
    return _jsonl_out(proc, len(reqs))


def cli_template_ids(deepinfer: str, texts: list[str]) -> list[list[int]]:
    """Ids of model-written text as the model emits them (added tokens recognised)."""
    proc = subprocess.run([deepinfer, "tokenize", "--template", "--jsonl"], input=_lines(texts),
                          capture_output=True, timeout=300)
    return _jsonl_out(proc, len(texts))


def cli_parse(deepinfer: str, api: str, req: dict, text: str, tmpdir: str, tag: str) -> str:
    """The non-stream API body ``deepinfer recipe parse`` writes for this output (backend Stop = EOS)."""
    path = os.path.join(tmpdir, f"req-{tag}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(dict(req, stream=False), f, ensure_ascii=False)
    proc = subprocess.run([deepinfer, "recipe", "parse", "--api", api, "--request", path, "--deterministic",
                           "--finish", "stop"], input=_lines([text] if text else []), capture_output=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")[-2000:]
    return proc.stdout.decode("utf-8")


def ref_parse(api: str, req: dict, text: str) -> str:
    chunks = [text] if text else []
    kw = dict(stream=False, prompt_tokens=0, cached_tokens=0, finish="stop")
    if api == "chat":
        return stream_oracle.parse_chat(req, "v4", chunks, **kw)
    if api == "responses":
        return stream_oracle_responses.parse_responses(req, chunks, **kw)
    return stream_oracle_messages.parse_messages(req, chunks, **kw)


def ref_render(api: str, enc: str, req: dict, ids: bool = False) -> dict:
    return recipe_oracle.RENDERERS[api](req, enc, ids=ids)


def first_diff(a, b) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclasses.dataclass
class Run:
    out: Out
    api: str
    enc: str
    thinking: bool
    tools_on: bool
    text: str = ""
    req0: dict | None = None
    req1: dict | None = None
    body: str = ""
    ref_body: str = ""
    p0: str = ""
    p1: str = ""
    ref_p1: str = ""
    i0: list | None = None
    i1: list | None = None
    gen_ids: list | None = None
    ref_i0: list | None = None
    ref_i1: list | None = None
    ref_gen_ids: list | None = None

    @property
    def key(self) -> str:
        return f"{self.out.id}|{self.api}|{self.enc}|{'think' if self.thinking else 'plain'}" + \
            ("" if self.tools_on else "|no-tools")

    @property
    def want(self) -> str:
        return self.p0 + self.text + EOS

    @property
    def holds_bytes(self) -> bool:
        return self.p1.startswith(self.want)

    @property
    def has_ids(self) -> bool:
        return self.i1 is not None

    @property
    def holds_ids(self) -> bool:
        w = self.i0 + self.gen_ids
        return self.i1[:len(w)] == w

    @property
    def ref_holds_ids(self) -> bool:
        w = self.ref_i0 + self.ref_gen_ids
        return self.ref_i1[:len(w)] == w

    @property
    def expected(self) -> set[str]:
        return self.out.expected_reasons(self.thinking, self.enc, self.tools_on)

    def divergence(self) -> str:
        """Where the next prompt leaves ``P0 + text + EOS`` (offset from the start of the text)."""
        i = first_diff(self.want, self.p1)
        lo = max(0, i - 40)
        return (f"{self.key}: diverges at generated offset {i - len(self.p0)}\n"
                f"  generated : {self.want[lo:i + 60]!r}\n  re-render : {self.p1[lo:i + 60]!r}")


def run_all(deepinfer: str, outs: list[Out], *, apis=APIS, encs=ENCODINGS, modes=(True, False),
            tools_on: bool = True, reference: bool = True, ids: bool = True, workers: int = 8) -> list[Run]:
    runs = [Run(o, api, enc, th, tools_on) for o in outs for api in apis for enc in encs for th in modes
            if th in o.modes]
    for r in runs:
        r.text = r.out.text(r.thinking, r.enc)
        r.req0 = first_request(r.api, r.enc, r.thinking, tools_on)
    with tempfile.TemporaryDirectory() as td, concurrent.futures.ThreadPoolExecutor(workers) as ex:
        bodies = list(ex.map(lambda ir: cli_parse(deepinfer, ir[1].api, ir[1].req0, ir[1].text, td, str(ir[0])),
                             enumerate(runs)))
    for r, b in zip(runs, bodies):
        r.body = b
        r.req1 = next_request(r.api, r.req0, json.loads(b))
        if reference:
            r.ref_body = ref_parse(r.api, r.req0, r.text)
    # render P0/P1 and their ids, batched per (api, encoding)
    for api in apis:
        for enc in encs:
            group = [r for r in runs if r.api == api and r.enc == enc]
            if not group:
                continue
            reqs = [r.req0 for r in group] + [r.req1 for r in group]
            prompts = cli_render(deepinfer, api, enc, reqs)
            n = len(group)
            for q, r in enumerate(group):
                assert "prompt" in prompts[q] and "prompt" in prompts[n + q], (r.key, prompts[q], prompts[n + q])
                r.p0, r.p1 = prompts[q]["prompt"], prompts[n + q]["prompt"]
            if not ids or enc not in ID_ENCODINGS:
                continue
            got = cli_render(deepinfer, api, enc, reqs, tokens=True)
            for q, r in enumerate(group):
                assert "ids" in got[q] and "ids" in got[n + q], (r.key, got[q], got[n + q])
                r.i0, r.i1 = got[q]["ids"], got[n + q]["ids"]
    texts = sorted({r.text for r in runs if r.enc in ID_ENCODINGS}) if ids else []
    tid = dict(zip(texts, cli_template_ids(deepinfer, texts) if texts else []))
    for r in runs:
        if r.text in tid:
            r.gen_ids = tid[r.text] + [EOS_ID]
    if reference:
        tok = stream_oracle._tokenizer()
        ref_tid = {t: tok.encode(t) for t in texts}
        ref0: dict[tuple, dict] = {}
        for r in runs:
            with_ids = ids and r.enc in ID_ENCODINGS
            k0 = (r.api, r.enc, r.thinking, r.tools_on)
            if k0 not in ref0:
                ref0[k0] = ref_render(r.api, r.enc, r.req0, ids=with_ids)
            got = ref_render(r.api, r.enc, r.req1, ids=with_ids)
            assert "prompt" in got, (r.key, got)
            r.ref_p1 = got["prompt"]
            if with_ids:
                r.ref_i1, r.ref_i0 = got["ids"], ref0[k0]["ids"]
                r.ref_gen_ids = ref_tid[r.text] + [EOS_ID]
    return runs


def summary(runs: list[Run]) -> dict:
    """Counts for the doc: per (source, api, encoding, mode) and per reason."""
    table: dict[str, dict] = {}
    for r in runs:
        row = table.setdefault(f"{r.out.source}|{r.api}|{r.enc}|{'think' if r.thinking else 'plain'}",
                               {"n": 0, "bytes": 0, "ids": 0, "ref_ids": 0})
        row["n"] += 1
        row["bytes"] += r.holds_bytes
        if r.has_ids:
            row["ids"] += r.holds_ids
            row["ref_ids"] += r.ref_holds_ids if r.ref_i1 is not None else 0
        else:
            row["ids"] = row["ref_ids"] = None
    reasons: dict[str, int] = {}
    for r in runs:
        for why in (r.expected or ({"-"} if r.holds_bytes else {"UNEXPLAINED"})):
            reasons[why] = reasons.get(why, 0) + 1
    return {"table": table, "reasons": reasons}
