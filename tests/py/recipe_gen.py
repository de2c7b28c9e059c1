"""Deterministic random OpenAI Chat Completions request generator.

* ``chat_requests(seed, n)``         -> n valid request dicts (accepted by deepseek-recipe 0.2.0)
* ``raw_chat_requests(seed, n)``     -> n valid requests as raw JSON text (duplicate keys,
                                        exotic number spellings, escapes) that a dict cannot carry
* ``invalid_chat_requests(seed, n)`` -> n request bodies (dict or raw str) that 0.2.0 rejects;
                                        each one is checked against the oracle.

Everything is driven by one ``random.Random(seed)``; no global state.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

MODELS = ["DeepSeek-V4-Pro", "DeepSeek-V4.1-Flash"]
EFFORTS = ["none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max"]
THINKING_TYPES = ["enabled", "adaptive", "disabled"]

SPECIALS = [
    "<｜User｜>", "<｜Assistant｜>", "<｜System｜>", "<think>", "</think>", "｜DSML｜",
    "<｜DSML｜tool_calls>", "</｜DSML｜ calls>", "<｜DSML｜ invoke name=\"x\">",
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜latest_reminder｜>",
    "<tool_result>", "</tool_result>", "<｜▁pad▁｜>", "<|User|>",
]
WORDS = [
    "hello", "world", "weather", "Paris", "東京", "中文", "données", "ümlaut", "emoji😀", "🦀",
    "a", "the", "JSON", "json", "tool", "\u2028", "\u2029", "\t", "\n", "\n\n", " ", "  ",
    "\r\n", "\\", "\"", "'", "{", "}", "[1, 2]", "$x", "<b>", "&amp;", "\u00a0", "\u200b",
    "ﬁ", "Ω", "\U0001F600", "x\x01y", "\x7f", "1e16", "-0.0", "null",
]
KEY_WORDS = ["city", "unit", "query", "n", "opts", "deep", "list", "名字", "é", "a b", "x-y", "", "k\"q", "flag", "value"]


def _text(rng: random.Random, lo: int = 0, hi: int = 8) -> str:
    n = rng.randint(lo, hi)
    parts = []
    for _ in range(n):
        r = rng.random()
        if r < 0.08:
            parts.append(rng.choice(SPECIALS))
        else:
            parts.append(rng.choice(WORDS))
    sep = rng.choice([" ", "", " ", "\n"])
    return sep.join(parts)


def _number(rng: random.Random) -> Any:
    return rng.choice([
        0, 1, -1, 42, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**63) - 1, 10**30,
        0.0, -0.0, 1.0, 2.5, -3.25, 0.1, 1e16, 1e15, 1e-5, 1e-4, 1.25e-5, 1e-6, 1e-7, 2e-7, 1e21, 1e100,
        1.7976931348623157e308, 5e-324, 123456789.125, 9999999999999998.0, 0.30000000000000004,
        rng.uniform(-1000, 1000), rng.randint(-10**6, 10**6), rng.random() * 10 ** rng.randint(-12, 20),
    ])


def _json_value(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth >= 3 or r < 0.45:
        return rng.choice([
            lambda: _text(rng, 0, 3), lambda: _number(rng), lambda: rng.choice([True, False]),
            lambda: None, lambda: _number(rng),
        ])()
    if r < 0.7:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {_key(rng): _json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def _key(rng: random.Random) -> str:
    k = rng.choice(KEY_WORDS)
    if rng.random() < 0.3:
        k += str(rng.randint(0, 99))
    return k


def _tool_name(rng: random.Random, i: int) -> str:
    base = rng.choice(["get_weather", "search", "f", "run-code", "Lookup_2", "x", "A" * 40, "calc"])
    return f"{base}_{i}" if rng.random() < 0.9 else f"{base}{i}"


# ---------------------------------------------------------------------------- schemas

def _schema(rng: random.Random, depth: int, strict: bool) -> dict:
    """A property schema that passes the package's JSON Schema meta-validation."""
    kinds = ["string", "number", "integer", "boolean", "null", "array"]
    if depth < 3:
        kinds += ["object", "object"]
    kind = rng.choice(kinds)
    s: dict = {}
    if rng.random() < 0.5:
        s["description"] = _text(rng, 1, 5)
    s["type"] = kind
    if kind == "string":
        if rng.random() < 0.3:
            s["enum"] = [_text(rng, 1, 2) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.2:
            s["minLength"] = rng.randint(0, 5)
    elif kind in ("number", "integer"):
        if rng.random() < 0.4:
            s["minimum"] = _number(rng) if kind == "number" else rng.randint(-100, 0)
        num = _number if kind == "number" else (lambda r: r.choice([0, -1, 7, 2**63 - 1, -(2**63), r.randint(-10**9, 10**9)]))
        if rng.random() < 0.4:
            s["enum"] = [num(rng) for _ in range(rng.randint(1, 5))]
        if rng.random() < 0.3:
            s["default"] = num(rng)
    elif kind == "array":
        s["items"] = _schema(rng, depth + 1, strict)
        if rng.random() < 0.3:
            s["maxItems"] = rng.randint(1, 10)
    elif kind == "object":
        props = {}
        for _ in range(rng.randint(1 if strict else 0, 3)):
            props[_key(rng)] = _schema(rng, depth + 1, strict)
        if strict and not props:
            props["v"] = {"type": "string"}
        s["properties"] = props
        if props and rng.random() < 0.5:
            s["required"] = list(props) if strict else rng.sample(list(props), rng.randint(0, len(props)))
        if not strict and rng.random() < 0.3:
            s["additionalProperties"] = rng.choice([True, False])
    if not strict and rng.random() < 0.25:
        s["x-extra"] = _json_value(rng)
    if rng.random() < 0.15:
        s["examples"] = [_json_value(rng) for _ in range(rng.randint(1, 2))]
    return s


def _tool(rng: random.Random, name: str, strict: bool) -> dict:
    fn: dict = {"name": name}
    r = rng.random()
    if r < 0.6:
        fn["description"] = _text(rng, 0, 10)
    elif r < 0.7:
        fn["description"] = None
    r = rng.random()
    if r < 0.85:
        params: dict = {"type": "object"}
        props = {}
        for _ in range(rng.randint(0, 4)):
            props[_key(rng)] = _schema(rng, 1, strict)
        if props or rng.random() < 0.5:
            params["properties"] = props
        if props and rng.random() < 0.5:
            params["required"] = list(props) if strict else rng.sample(list(props), rng.randint(1, len(props)))
        if not strict and rng.random() < 0.2:
            params["additionalProperties"] = False
        if not strict and rng.random() < 0.2:
            params["$defs"] = {"thing": {"type": "string"}}
        if rng.random() < 0.2:
            # put "type" last to test key order preservation
            params = {k: params[k] for k in sorted(params, key=lambda k: k == "type")}
        fn["parameters"] = params
    elif r < 0.92:
        pass  # no parameters -> rendered as {}
    else:
        fn["parameters"] = None
    if strict:
        fn["strict"] = True
    elif rng.random() < 0.1:
        fn["strict"] = False
    return {"type": "function", "function": fn}


# ---------------------------------------------------------------------------- messages

def _content(rng: random.Random, allow_parts: bool = True, lo: int = 0) -> Any:
    if allow_parts and rng.random() < 0.25:
        return [{"type": "text", "text": _text(rng, 0, 4)} for _ in range(rng.randint(0, 3))] or \
               [{"type": "text", "text": _text(rng, lo, 4)}]
    return _text(rng, lo, 10)


def _arguments(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.65:
        obj = {_key(rng): _json_value(rng, 1) for _ in range(rng.randint(0, 5))}
        return json.dumps(obj, ensure_ascii=rng.random() < 0.5,
                          separators=rng.choice([(",", ":"), (", ", ": ")]),
                          indent=rng.choice([None, None, None, 2]))
    if r < 0.72:
        return ""
    if r < 0.8:
        return json.dumps(_json_value(rng, 2))  # non-object JSON (may be scalar)
    return rng.choice([
        "not json", "{", "{\"a\": }", "{'a': 1}", "[1, 2", "{\"a\":1} trailing",
        "{\"a\":1,}", "NaN", "{\"x\": NaN}", " {\"a\": 1} ", "\"str\"", "{\"k\": \"v\"}\n",
    ]) + (_text(rng, 0, 2) if rng.random() < 0.3 else "")


class _Ids:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.n = 0

    def next(self) -> str:
        self.n += 1
        return self.rng.choice(["call_", "toolu_", "", "id-", "调用"]) + str(self.n)


def _assistant(rng: random.Random, ids: _Ids, tool_names: list[str], thinking_hint: bool) -> tuple[dict, list[dict]]:
    m: dict = {"role": "assistant"}
    results: list[dict] = []
    with_calls = rng.random() < 0.35
    r = rng.random()
    if with_calls:
        if r < 0.3:
            m["content"] = None
        elif r < 0.5:
            pass  # content omitted
        elif r < 0.6:
            m["content"] = ""
        else:
            m["content"] = _content(rng)
    else:
        m["content"] = _content(rng)
    if rng.random() < (0.6 if thinking_hint else 0.3):
        m["reasoning_content"] = _text(rng, 0, 8) if rng.random() < 0.9 else None
    if with_calls:
        calls = []
        for _ in range(rng.randint(1, 4)):
            cid = ids.next()
            name = rng.choice(tool_names) if tool_names and rng.random() < 0.8 else _tool_name(rng, rng.randint(0, 9))
            calls.append({"id": cid, "type": "function", "function": {"name": name, "arguments": _arguments(rng)}})
            results.append({"role": "tool", "tool_call_id": cid, "content": _content(rng, allow_parts=rng.random() < 0.3)})
        m["tool_calls"] = calls
        rng.shuffle(results)
    return m, results


def _messages(rng: random.Random, tool_names: list[str], thinking_hint: bool) -> list[dict]:
    ids = _Ids(rng)
    msgs: list[dict] = []
    for _ in range(rng.choice([0, 0, 1, 1, 1, 2, 3])):
        msgs.append({"role": "system", "content": _content(rng)})
    turns = rng.randint(1, 5)
    for t in range(turns):
        r = rng.random()
        if r < 0.1:
            msgs.append({"role": "system", "content": _content(rng)})
        elif r < 0.15:
            msgs.append({"role": "latest_reminder", "content": _text(rng, 0, 5)})
        for _ in range(rng.choice([1, 1, 1, 1, 2, 3])):
            msgs.append({"role": "user", "content": _content(rng)})
        if rng.random() < 0.08:
            msgs.append({"role": "system", "content": _content(rng)})
        last = t == turns - 1
        if not last or rng.random() < 0.3:
            a, res = _assistant(rng, ids, tool_names, thinking_hint)
            msgs.append(a)
            if res:
                msgs.extend(res)
                if rng.random() < 0.5:
                    a2, res2 = _assistant(rng, ids, tool_names, thinking_hint)
                    msgs.append(a2)
                    msgs.extend(res2)
            elif last and rng.random() < 0.3:
                msgs[-1]["prefix"] = True
                if msgs[-1].get("content") is None:
                    msgs[-1]["content"] = ""
    if rng.random() < 0.05:
        msgs = [m for m in msgs if m["role"] == "system"] or [{"role": "user", "content": "x"}]
    return msgs


def _contains_json(msgs: list[dict]) -> bool:
    for m in msgs:
        c = m.get("content")
        texts = [c] if isinstance(c, str) else [p.get("text", "") for p in c] if isinstance(c, list) else []
        if any("json" in t.lower() for t in texts):
            return True
    return False


def _one_valid(rng: random.Random) -> dict:
    req: dict = {"model": rng.choice(MODELS)}
    # thinking
    thinking_on = True
    r = rng.random()
    if r < 0.35:
        t = rng.choice(THINKING_TYPES)
        req["thinking"] = {"type": t}
        if rng.random() < 0.2:
            req["thinking"]["budget_tokens"] = rng.randint(1, 10000)
        thinking_on = t != "disabled"
        if rng.random() < 0.4:
            req["reasoning_effort"] = rng.choice(EFFORTS)
    elif r < 0.8:
        e = rng.choice(EFFORTS)
        req["reasoning_effort"] = e
        thinking_on = e != "none"
    elif r < 0.85:
        req["thinking"] = None
        req["reasoning_effort"] = None
    # tools
    tool_names: list[str] = []
    if rng.random() < 0.5:
        tools = []
        strict = rng.random() < 0.12  # 0.2.0 rejects mixing strict and non-strict tools
        for i in range(rng.randint(0, 4)):
            name = _tool_name(rng, i)
            tool_names.append(name)
            tools.append(_tool(rng, name, strict))
        req["tools"] = tools
        choices = ["none", "auto", None, None]
        if not thinking_on:
            choices += ["required", "required", "named", "named"]
        c = rng.choice(choices)
        if c == "named":
            if tool_names:
                req["tool_choice"] = {"type": "function", "function": {"name": rng.choice(tool_names)}}
        elif c is not None:
            req["tool_choice"] = c
    elif rng.random() < 0.1:
        req["tool_choice"] = rng.choice(["none", "auto"] + ([] if thinking_on else ["required"]))
    msgs = _messages(rng, tool_names, thinking_on)
    req["messages"] = msgs
    strict_tools = any(t["function"].get("strict") for t in req.get("tools", []))
    prefix = msgs[-1].get("prefix")
    if prefix and (req.get("tools") or any("tool_calls" in m for m in msgs)):
        del msgs[-1]["prefix"]  # 0.2.0: "Function call should not be used with prefix"
    # response format (0.2.0: not with strict tools, json_object not with prefix)
    r = rng.random() if not strict_tools else 1.0
    if r < 0.15 and not prefix:
        if not _contains_json(msgs):
            msgs.append({"role": "user", "content": rng.choice(["Reply in JSON.", "json please", "Use Json"])})
        req["response_format"] = {"type": "json_object"}
    elif r < 0.2:
        req["response_format"] = {"type": "text"}
    elif r < 0.23:
        req["response_format"] = {"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object", "properties": {"a": {"type": "number", "enum": [1.5, 1e-5]}}}}}
    # sampling & misc
    if rng.random() < 0.3:
        req["max_tokens"] = rng.choice([1, 16, 4096, 393216, rng.randint(1, 100000)])
    if rng.random() < 0.3:
        req["temperature"] = rng.choice([0, 0.0, 0.7, 1, 2, 2.0, rng.uniform(0, 2)])
    if rng.random() < 0.3:
        req["top_p"] = rng.choice([1, 1.0, 0.9, 0.01, rng.uniform(0.001, 1)])
    if rng.random() < 0.25:
        req["stop"] = rng.choice([_text(rng, 1, 2) or "x", [], [_text(rng, 1, 2) or "y" for _ in range(rng.randint(1, 16))]])
    if rng.random() < 0.1:
        req["stream"] = True
        if rng.random() < 0.5:
            req["stream_options"] = {"include_usage": rng.choice([True, False])}
    if rng.random() < 0.05:
        req["n"] = 1
    if rng.random() < 0.05:
        req["seed"] = rng.randint(0, 2**63 - 1)
    if rng.random() < 0.05:
        req["frequency_penalty"] = rng.uniform(-2, 2)
        req["presence_penalty"] = rng.uniform(-2, 2)
    if rng.random() < 0.05:
        req["parallel_tool_calls"] = rng.choice([True, False])
    if rng.random() < 0.05:
        req["logprobs"] = True
        req["top_logprobs"] = rng.randint(0, 20)
    if rng.random() < 0.05:
        req["user"] = "u-" + str(rng.randint(0, 99))
    if rng.random() < 0.05:
        req["x_unknown_field"] = _json_value(rng)
    # shuffle top-level key order sometimes
    if rng.random() < 0.3:
        keys = list(req)
        rng.shuffle(keys)
        req = {k: req[k] for k in keys}
    return req


def _accepted(req: Any) -> bool:
    import recipe_oracle
    return "prompt" in recipe_oracle.render_chat(req, "v4.1")


def chat_requests(seed: int, n: int) -> list[dict]:
    """n valid requests; a candidate the package rejects is replaced (generator bugs only)."""
    rng = random.Random(seed)
    out: list[dict] = []
    while len(out) < n:
        req = _one_valid(rng)
        if _accepted(req):
            out.append(req)
    return out


# ---------------------------------------------------------------------------- raw JSON text

_RAW_NUMBERS = ["1e16", "1E16", "1e+16", "-0", "-0.0", "1.0e0", "100e-2", "0.00001", "1e-5", "2.50",
                "12345678901234567890", "18446744073709551616", "-9223372036854775809", "1e400"[0:4],
                "0.1e1", "5e-324", "123456789012345678901234567890", "9.999999999999999e15"]


def raw_chat_requests(seed: int, n: int) -> list[str]:
    """Valid requests as raw JSON text: duplicate keys, number spellings, escapes, whitespace."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        nums = ", ".join(rng.sample(_RAW_NUMBERS, rng.randint(1, 6)))
        dup = rng.choice(['"a": 1, "b": 2, "a": 3', '"type": "string", "type": "number"', '"x": {"p": 1}, "x": [1]', '"k": 1'])
        esc = rng.choice(["\\u00e9\\u2028", "\\ud83d\\ude00", "a\\/b", "\\\"q\\\"", "\\u003c\\uff5cUser\\uff5c\\u003e", "\\t\\r\\b\\f\\u0001"])
        args = json.dumps('{"v": [%s], %s, "s": "%s"}' % (nums, dup, esc))
        choice = rng.choice(['"none"', '"auto"']) if rng.random() < 0.5 else ('"required"' if rng.random() < 0.5 else '{"type": "function", "function": {"name": "f"}}')
        sp = rng.choice(["", " ", "\t", "  "])
        text = (
            '{%s"model"%s:%s"%s",%s"thinking":{"type":"disabled"},"tool_choice":%s,'
            '"tools":[{"type":"function","function":{"name":"f","description":"%s","parameters":'
            '{"type":"object","properties":{"p":{"type":"number","enum":[%s]},"q":{"description":"d",%s}}}}}],'
            '"messages":[{"role":"user","content":"%s"},{"role":"assistant","content":null,"tool_calls":'
            '[{"id":"c1","type":"function","function":{"name":"f","arguments":%s}}]},'
            '{"role":"tool","tool_call_id":"c1","content":"ok %s"},{"role":"user","content":"%s","content":"again"}]%s}'
        ) % (sp, sp, sp, rng.choice(MODELS), sp, choice, esc, nums, dup, esc, args, esc, esc, sp)
        if _accepted(text):
            out.append(text)
    return out


# ---------------------------------------------------------------------------- invalid

def _mutations(rng: random.Random, req: dict) -> list:
    """Each mutation returns a new (possibly raw str) body that should be rejected."""
    M = []

    def setk(k, v):
        def f(r):
            r = copy.deepcopy(r); r[k] = v; return r
        return f

    def delk(k):
        def f(r):
            r = copy.deepcopy(r); r.pop(k, None); return r
        return f

    def msg(fn):
        def f(r):
            r = copy.deepcopy(r); fn(r["messages"]); return r
        return f

    M += [delk("model"), setk("model", rng.choice(["gpt-4o", "deepseek-chat", "deepseek-v4-pro", "", 7, None]))]
    M += [delk("messages"), setk("messages", []), setk("messages", {}), setk("messages", None), setk("messages", "hi")]
    M += [setk("max_tokens", rng.choice([0, -1, 393217, 1.5, "10"])), setk("temperature", rng.choice([-0.5, 2.01, 3, "hot"]))]
    M += [setk("top_p", rng.choice([0, 0.0, -0.1, 1.01, 2])), setk("n", rng.choice([0, 2, 5])), setk("stop", ["s"] * 17)]
    M += [setk("stop", rng.choice([5, {"a": 1}, [1]])), setk("stream_options", {"include_usage": True})]
    M += [setk("reasoning_effort", rng.choice(["extreme", "HIGH", "", 3])), setk("thinking", rng.choice([{"type": "on"}, {}, "enabled", True]))]
    M += [setk("frequency_penalty", rng.choice([2.5, -3])), setk("presence_penalty", rng.choice([2.1, -2.1])), setk("seed", rng.choice([-1, 2**63]))]
    M += [setk("top_logprobs", 21), setk("response_format", rng.choice([{"type": "xml"}, "json_object", {}]))]
    M += [setk("tool_choice", rng.choice(["any", "function", {"type": "function", "function": {"name": "no_such_tool"}}, {"type": "function"}, 3]))]
    bad_tools = rng.choice([
        [{"type": "function", "function": {"name": "bad name"}}],
        [{"type": "function", "function": {"name": ""}}],
        [{"type": "function", "function": {"name": "x" * 129}}],
        [{"type": "function", "function": {"name": "dup"}}, {"type": "function", "function": {"name": "dup"}}],
        [{"type": "retrieval", "function": {"name": "r"}}],
        [{"type": "function"}],
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
        [{"type": "function", "function": {"name": "f", "parameters": {"properties": {}}}}],
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}}}}],
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "object"}}}, "strict": True}}],
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}, "required": ["a"]}, "strict": True}}],
        {"a": 1},
    ])
    M += [setk("tools", bad_tools)]
    # forced tool choice with thinking on
    M += [lambda r: {**copy.deepcopy(r), "thinking": {"type": "enabled"},
                     "tools": [{"type": "function", "function": {"name": "f"}}],
                     "tool_choice": rng.choice(["required", {"type": "function", "function": {"name": "f"}}])}]
    # json mode without the word json
    M += [lambda r: {"model": r["model"], "messages": [{"role": "user", "content": "no keyword here"}], "response_format": {"type": "json_object"}}]
    # message-level
    M += [msg(lambda ms: ms.append({"role": rng.choice(["developer", "function", "bot", "User", ""]), "content": "x"}))]
    M += [msg(lambda ms: ms.append({"content": "x"})), msg(lambda ms: ms.append({"role": "user"}))]
    M += [msg(lambda ms: ms.append({"role": "user", "content": rng.choice([5, None, {"text": "x"}, True])}))]
    M += [msg(lambda ms: ms.append({"role": "user", "content": [rng.choice([{"type": "foo", "text": "x"}, {"type": "text"}, "x", {"text": "x"}])]}))]
    M += [msg(lambda ms: ms.append({"role": "assistant"})), msg(lambda ms: ms.append({"role": "assistant", "content": None}))]
    M += [msg(lambda ms: ms.append({"role": "assistant", "content": "c", "tool_calls": []}))]
    M += [msg(lambda ms: ms.append({"role": "assistant", "content": "c", "reasoning_content": 5}))]
    M += [msg(lambda ms: ms.append({"role": "tool", "tool_call_id": "stray", "content": "r"}))]
    M += [msg(lambda ms: ms.extend([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "q1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "q2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "q1", "content": "r"}]))]
    M += [msg(lambda ms: ms.extend([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "q1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "zz", "content": "r"}]))]
    M += [msg(lambda ms: ms.extend([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "q1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "q1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "q1", "content": "r"}, {"role": "tool", "tool_call_id": "q1", "content": "r"}]))]
    M += [msg(lambda ms: ms.extend([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "q1", "type": "function", "function": {"name": "f", "arguments": rng.choice([{}, 5, None])}}]},
        {"role": "tool", "tool_call_id": "q1", "content": "r"}]))]
    M += [msg(lambda ms: ms.extend([{"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]))]
    M += [msg(lambda ms: ms.extend([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "q1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "r"}]))]
    M += [msg(lambda ms: ms.insert(0, {"role": "assistant", "content": "p", "prefix": True}))]
    # raw-text bodies
    M += [lambda r: rng.choice(["{", "not json", "[]", "null", "{\"model\": \"DeepSeek-V4-Pro\"}", "[1]",
                                json.dumps(r)[:-1], json.dumps(r) + "x"])]
    return M


def invalid_chat_requests(seed: int, n: int) -> list:
    """n bodies (dict, or raw str for malformed JSON) that deepseek-recipe 0.2.0 rejects."""
    import recipe_oracle
    rng = random.Random(seed)
    out: list = []
    while len(out) < n:
        base = _one_valid(rng)
        muts = _mutations(rng, base)
        body = rng.choice(muts)(base)
        if "status" in recipe_oracle.render_chat(body, "v4.1"):
            out.append(body)
    return out
