"""Deterministic random OpenAI Responses / Anthropic Messages request generators.

* ``responses_requests(seed, n)``         -> n valid Responses bodies (accepted by deepseek-recipe 0.2.0)
* ``invalid_responses_requests(seed, n)`` -> n Responses bodies (dict or raw str) that 0.2.0 rejects
* ``messages_requests(seed, n)``          -> n valid Anthropic Messages bodies
* ``invalid_messages_requests(seed, n)``  -> n Messages bodies (dict or raw str) that 0.2.0 rejects

Every body is checked against the oracle (``recipe_oracle.render_responses`` / ``render_messages``, V4.1);
a candidate on the wrong side is discarded and another one drawn.  Images / files / documents are not
generated.  Shares the text / schema / arguments helpers of ``recipe_gen`` (Chat).

Everything is driven by one ``random.Random(seed)``; no global state.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import recipe_gen as g
import recipe_oracle

MODELS = g.MODELS
EFFORTS = ["none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max"]
_text = g._text
_key = g._key
_json_value = g._json_value
_tool_name = g._tool_name
_arguments = g._arguments
_schema = g._schema


def _params(rng: random.Random, strict: bool) -> dict:
    """An object JSON Schema accepted as tool parameters (as recipe_gen._tool builds them)."""
    params: dict = {"type": "object"}
    props = {}
    for _ in range(rng.randint(1 if strict else 0, 4)):
        props[_key(rng)] = _schema(rng, 1, strict)
    if props or strict or rng.random() < 0.5:
        params["properties"] = props
    if props and rng.random() < 0.5:
        params["required"] = list(props) if strict else rng.sample(list(props), rng.randint(1, len(props)))
    if not strict and rng.random() < 0.2:
        params["additionalProperties"] = False
    if rng.random() < 0.2:
        params = {k: params[k] for k in sorted(params, key=lambda k: k == "type")}
    return params


def _ids(rng: random.Random):
    n = [0]
    prefix = rng.choice(["call_", "toolu_", "", "id-", "调用", "c"])

    def nxt() -> str:
        n[0] += 1
        # mixed widths so byte-string order differs from numeric order (c10 < c2)
        return prefix + str(n[0] if rng.random() < 0.7 else rng.randint(0, 999)) + (rng.choice(["", "", "x", "B", "_z"]))
    return nxt


def _contains_json(texts) -> bool:
    return any("json" in t.lower() for t in texts)


# ============================================================================ Responses

def _r_content(rng: random.Random, role: str) -> Any:
    if rng.random() < 0.55:
        return _text(rng, 0, 10)
    kinds = ["input_text", "output_text"]
    pref = "output_text" if role == "assistant" else "input_text"
    parts = []
    for _ in range(rng.randint(0, 3)):
        parts.append({"type": pref if rng.random() < 0.85 else rng.choice(kinds), "text": _text(rng, 0, 5)})
    return parts


def _r_message(rng: random.Random, role: str) -> dict:
    m: dict = {}
    if rng.random() < 0.4:
        m["type"] = "message"
    m["role"] = role
    m["content"] = _r_content(rng, role)
    if rng.random() < 0.1:
        m["id"] = "msg_" + str(rng.randint(0, 999))
    if role == "assistant" and rng.random() < 0.1:
        m["status"] = "completed"
    return m


def _r_reasoning(rng: random.Random) -> dict:
    it: dict = {"type": "reasoning"}
    if rng.random() < 0.3:
        it["id"] = "rs_" + str(rng.randint(0, 99))
    r = rng.random()
    if r < 0.8:
        it["summary"] = [] if rng.random() < 0.7 else [{"type": "summary_text", "text": _text(rng, 0, 4)}]
    if rng.random() < 0.85:
        it["content"] = [{"type": "reasoning_text", "text": _text(rng, 0, 8)} for _ in range(rng.randint(0, 3))]
    if rng.random() < 0.1:
        it["encrypted_content"] = "gAAAA" + str(rng.randint(0, 10**6))
    return it


def _r_tools(rng: random.Random, thinking_on: bool) -> tuple[list, list[str], bool]:
    tools: list = []
    names: list[str] = []
    strict = rng.random() < 0.12
    for i in range(rng.randint(0, 4)):
        name = _tool_name(rng, i)
        names.append(name)
        t: dict = {"type": "function", "name": name}
        r = rng.random()
        if r < 0.6:
            t["description"] = _text(rng, 0, 8)
        elif r < 0.7:
            t["description"] = None
        r = rng.random()
        if r < 0.85 or strict:
            t["parameters"] = _params(rng, strict)
        elif r < 0.92:
            t["parameters"] = None
        if strict:
            t["strict"] = True
        elif rng.random() < 0.1:
            t["strict"] = False
        tools.append(t)
    if not strict and rng.random() < 0.1:
        ns = "ns" + str(rng.randint(0, 9))
        inner = []
        for j in range(rng.randint(1, 2)):
            fn: dict = {"type": "function", "name": "fn" + str(j)}
            if rng.random() < 0.5:
                fn["description"] = _text(rng, 0, 4)
            if rng.random() < 0.5:
                fn["parameters"] = _params(rng, False)
            inner.append(fn)
            names.append(f"{ns}::fn{j}")
        nst: dict = {"type": "namespace", "name": ns, "tools": inner}
        if rng.random() < 0.6:
            nst["description"] = _text(rng, 0, 4)
        tools.insert(rng.randint(0, len(tools)), nst)
    if not strict and rng.random() < 0.06:
        tools.append({"type": "custom", "name": "apply_patch"})
        names.append("apply_patch")
    if rng.random() < 0.05:
        tools.append({"type": rng.choice(["web_search", "web_search_preview"])})
    return tools, names, strict


def _r_call_group(rng: random.Random, nxt, names: list[str]) -> list[dict]:
    calls, outs = [], []
    for _ in range(rng.randint(1, 3)):
        cid = nxt()
        r = rng.random()
        if r < 0.08:
            calls.append({"type": "custom_tool_call", "call_id": cid, "name": "apply_patch",
                          "input": "*** Begin Patch\n" + _text(rng, 0, 3) + "\n*** End Patch"})
            outs.append({"type": "custom_tool_call_output", "call_id": cid, "output": _text(rng, 0, 4)})
            continue
        name = rng.choice(names) if names and rng.random() < 0.8 else _tool_name(rng, rng.randint(0, 9))
        c: dict = {"type": "function_call", "call_id": cid, "name": name, "arguments": _arguments(rng)}
        if rng.random() < 0.05 and "::" not in name:
            c["namespace"] = "ns" + str(rng.randint(0, 3))
        if rng.random() < 0.15:
            c["id"] = "fc_" + str(rng.randint(0, 999))
            c["status"] = "completed"
        calls.append(c)
        if rng.random() < 0.75:
            out: Any = _text(rng, 0, 8)
        else:
            out = [{"type": "input_text", "text": _text(rng, 0, 4)} for _ in range(rng.randint(0, 2))]
        outs.append({"type": "function_call_output", "call_id": cid, "output": out})
    order = rng.random()
    if order < 0.5:  # all calls, then outputs in random order
        rng.shuffle(outs)
        return calls + outs
    if order < 0.75:  # call/output pairs (each pair its own group)
        items = []
        for c, o in zip(calls, outs):
            items += [c, o]
        return items
    # calls in random order, outputs in random order
    rng.shuffle(calls)
    rng.shuffle(outs)
    return calls + outs


def _r_items(rng: random.Random, names: list[str]) -> list[dict]:
    nxt = _ids(rng)
    items: list[dict] = []
    for _ in range(rng.choice([0, 0, 0, 1, 1, 2])):
        items.append(_r_message(rng, rng.choice(["system", "developer"])))
    turns = rng.randint(1, 4)
    for t in range(turns):
        if rng.random() < 0.08:
            items.append(_r_message(rng, rng.choice(["system", "developer"])))
        for _ in range(rng.choice([1, 1, 1, 2])):
            items.append(_r_message(rng, "user"))
        last = t == turns - 1
        if last and rng.random() < 0.6:
            break
        # assistant side: any mix of reasoning, assistant messages and call groups
        for _ in range(rng.randint(1, 4)):
            r = rng.random()
            if r < 0.3:
                items.append(_r_reasoning(rng))
            elif r < 0.6:
                items.append(_r_message(rng, "assistant"))
            elif r < 0.95:
                items += _r_call_group(rng, nxt, names)
            else:
                items.append({"type": "item_reference", "id": "x"} if rng.random() < 0.5 else {"type": "bogus"})
    return items


def _r_texts(req: dict) -> list[str]:
    out = []
    if isinstance(req.get("instructions"), str):
        out.append(req["instructions"])
    inp = req.get("input")
    if isinstance(inp, str):
        out.append(inp)
    elif isinstance(inp, list):
        for it in inp:
            c = it.get("content") if it.get("type", "message") == "message" else None
            if isinstance(c, str):
                out.append(c)
            elif isinstance(c, list):
                out += [p.get("text", "") for p in c]
    return out


def _one_responses(rng: random.Random) -> dict:
    req: dict = {"model": rng.choice(MODELS)}
    thinking_on = True
    r = rng.random()
    if r < 0.7:
        e = rng.choice(EFFORTS)
        req["reasoning"] = {"effort": e}
        thinking_on = e != "none"
        if rng.random() < 0.15:
            req["reasoning"]["summary"] = rng.choice(["auto", "concise", "detailed", None])
    elif r < 0.75:
        req["reasoning"] = {}
    elif r < 0.8:
        req["reasoning"] = None
    if rng.random() < 0.35:
        req["instructions"] = _text(rng, 0, 10) if rng.random() < 0.9 else ""
    tools, names, strict = ([], [], False)
    if rng.random() < 0.5:
        tools, names, strict = _r_tools(rng, thinking_on)
        req["tools"] = tools
        fn_names = [t["name"] for t in tools if t.get("type") == "function"]
        choices = ["none", "auto", None, None]
        if not thinking_on:
            choices += ["required", "required", "named", "named"]
        c = rng.choice(choices)
        if c == "named":
            if fn_names:
                req["tool_choice"] = {"type": "function", "name": rng.choice(fn_names)}
            elif "apply_patch" in names:
                req["tool_choice"] = {"type": "custom", "name": "apply_patch"}
        elif c is not None:
            req["tool_choice"] = c
    elif rng.random() < 0.08:
        req["tool_choice"] = rng.choice(["none", "auto"] + ([] if thinking_on else ["required"]))
    if rng.random() < 0.25:
        req["input"] = _text(rng, 0, 12)
    else:
        req["input"] = _r_items(rng, names)
    r = rng.random() if not strict else 1.0
    if r < 0.12:
        if not _contains_json(_r_texts(req)):
            if isinstance(req["input"], str):
                req["input"] += rng.choice([" Reply in JSON.", " json please"])
            else:
                req["input"].append({"role": "user", "content": rng.choice(["Reply in JSON.", "Use Json"])})
        req["text"] = {"format": {"type": "json_object"}}
    elif r < 0.17:
        req["text"] = {"format": {"type": "text"}}
    elif r < 0.22:
        req["text"] = {"format": {"type": "json_schema", "name": "out", "strict": rng.choice([True, False]),
                                  "schema": {"type": "object", "properties": {"a": {"type": "number", "enum": [1.5, 1e-5]}}}}}
    elif r < 0.25:
        req["text"] = {"verbosity": rng.choice(["low", "medium", "high"])}
    if rng.random() < 0.3:
        req["max_output_tokens"] = rng.choice([1, 16, 4096, 393216, rng.randint(1, 100000)])
    if rng.random() < 0.3:
        req["temperature"] = rng.choice([0, 0.0, 0.7, 1, 2, rng.uniform(0, 2)])
    if rng.random() < 0.3:
        req["top_p"] = rng.choice([1, 1.0, 0.9, 0.01, rng.uniform(0.001, 1)])
    if rng.random() < 0.1:
        req["stream"] = rng.choice([True, False])
    if rng.random() < 0.05:
        req["store"] = False
        req["parallel_tool_calls"] = rng.choice([True, False])
    if rng.random() < 0.05:
        req["user"] = "u-" + str(rng.randint(0, 99))
        req["metadata"] = {"k": "v"}
    if rng.random() < 0.05:
        req["top_logprobs"] = rng.randint(0, 20)
    if rng.random() < 0.05:
        req["x_unknown_field"] = _json_value(rng)
    if rng.random() < 0.3:
        keys = list(req)
        rng.shuffle(keys)
        req = {k: req[k] for k in keys}
    return req


def responses_requests(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    out: list[dict] = []
    while len(out) < n:
        req = _one_responses(rng)
        if "prompt" in recipe_oracle.render_responses(req, "v4.1"):
            out.append(req)
    return out


def _r_mutations(rng: random.Random, req: dict) -> list:
    def setk(k, v):
        def f(r):
            r = copy.deepcopy(r); r[k] = v; return r
        return f

    def delk(*ks):
        def f(r):
            r = copy.deepcopy(r)
            for k in ks:
                r.pop(k, None)
            return r
        return f

    def items(extra):
        def f(r):
            r = copy.deepcopy(r)
            inp = r.get("input")
            if not isinstance(inp, list):
                inp = [{"role": "user", "content": inp if isinstance(inp, str) else "q"}]
            r["input"] = inp + extra
            return r
        return f

    fc = lambda cid, name="f", args="{}": {"type": "function_call", "call_id": cid, "name": name, "arguments": args}
    fo = lambda cid, out="o": {"type": "function_call_output", "call_id": cid, "output": out}
    M = []
    M += [delk("model"), setk("model", rng.choice(["gpt-4o", "deepseek-chat", "deepseek-v4-pro", "", 7, None]))]
    M += [delk("input", "instructions"), setk("input", []), setk("input", rng.choice([5, {"role": "user"}, True]))]
    M += [setk("max_output_tokens", rng.choice([0, -1, 393217, 1.5, "10"]))]
    M += [setk("temperature", rng.choice([-0.5, 2.01, 3, "hot"])), setk("top_p", rng.choice([0, 0.0, -0.1, 1.01, 2]))]
    M += [setk("top_logprobs", rng.choice([21, -1])), setk("reasoning", rng.choice([{"effort": "extreme"}, {"effort": "HIGH"}, {"effort": ""}, "high", 3]))]
    M += [setk("instructions", rng.choice([5, ["x"], {"a": 1}]))]
    M += [setk("text", rng.choice([{"format": {"type": "xml"}}, {"format": {"type": "regex"}}, {"format": {"type": "json_schema", "name": "o"}}, {"format": "json_object"}, "text"]))]
    M += [lambda r: {"model": r["model"], "input": "no keyword here", "text": {"format": {"type": "json_object"}}}]
    M += [setk("tool_choice", rng.choice(["any", "function", {"type": "function", "name": "no_such_tool"}, {"type": "function"},
                                           {"type": "allowed_tools", "mode": "auto", "tools": []}, 3]))]
    bad_tools = rng.choice([
        [{"type": "function", "name": "bad name"}],
        [{"type": "function", "name": ""}],
        [{"type": "function", "name": "x" * 129}],
        [{"type": "function", "name": "dup"}, {"type": "function", "name": "dup"}],
        [{"type": "function", "name": "f", "strict": True, "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}, {"type": "function", "name": "g"}],
        [{"type": "custom", "name": "other_tool"}],
        [{"type": "retrieval", "name": "r"}],
        [{"type": "function"}],
        [{"type": "function", "name": "f", "parameters": {"type": "array"}}],
        [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}}}],
        [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "object"}}}, "strict": True}],
        [{"type": "function", "name": "f", "description": 5}],
        {"a": 1},
    ])
    M += [setk("tools", bad_tools)]
    M += [lambda r: {**copy.deepcopy(r), "reasoning": {"effort": rng.choice(["low", "high", "max"])},
                     "tools": [{"type": "function", "name": "f"}],
                     "tool_choice": rng.choice(["required", {"type": "function", "name": "f"}])}]
    M += [lambda r: {**copy.deepcopy(r), "tools": [{"type": "function", "name": "f", "strict": True, "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}],
                     "input": "json", "text": {"format": {"type": rng.choice(["json_object", "json_schema"]), "name": "o", "schema": {"type": "object"}}}}]
    # item-level
    M += [items([fc("zz1")]), items([fo("zz2")]), items([fc("zz3"), fc("zz3"), fo("zz3")]), items([fc("zz4"), fo("zz4"), fo("zz4")])]
    M += [items([fc("zz5"), {"role": "user", "content": "mid"}, fo("zz5")]), items([fc(""), fo("")]), items([fc("zz6"), fo("zz7")])]
    M += [items([fc("zz8"), fo("zz8"), fc("zz8"), fo("zz8")])]
    M += [items([{"role": rng.choice(["tool", "function", "bot", "User", ""]), "content": "x"}]), items([{"role": "user"}])]
    M += [items([{"role": "user", "content": rng.choice([5, None, {"text": "x"}, True])}])]
    M += [items([{"role": "user", "content": [rng.choice([{"type": "foo", "text": "x"}, {"type": "input_text"}, "x", {"text": "x"}, {"type": "refusal", "refusal": "no"}])]}])]
    M += [items([rng.choice([5, "x", None, []])])]
    M += [items([{"type": "function_call", "call_id": "q", "name": "f"}]), items([{"type": "function_call", "call_id": "q", "name": "f", "arguments": {}}])]
    M += [items([{"type": "function_call", "name": "f", "arguments": "{}"}]), items([{"type": "function_call_output", "call_id": "q"}])]
    M += [lambda r: rng.choice(["{", "not json", "[]", "null", "{\"model\": \"DeepSeek-V4-Pro\"}", "[1]",
                                json.dumps(r, ensure_ascii=False)[:-1], json.dumps(r, ensure_ascii=False) + "x"])]
    return M


def invalid_responses_requests(seed: int, n: int) -> list:
    rng = random.Random(seed)
    out: list = []
    while len(out) < n:
        base = _one_responses(rng)
        body = rng.choice(_r_mutations(rng, base))(base)
        if "status" in recipe_oracle.render_responses(body, "v4.1"):
            out.append(body)
    return out


# ============================================================================ Messages

def _m_text_block(rng: random.Random, lo: int = 0) -> dict:
    b: dict = {"type": "text", "text": _text(rng, lo, 6)}
    if rng.random() < 0.05:
        b["cache_control"] = {"type": "ephemeral"}
    return b


def _m_user(rng: random.Random, results: list[dict] | None = None) -> dict:
    if results:
        blocks = list(results)
        for _ in range(rng.choice([0, 0, 1, 2])):
            blocks.append(_m_text_block(rng))
        return {"role": "user", "content": blocks}
    if rng.random() < 0.6:
        return {"role": "user", "content": _text(rng, 0, 10)}
    return {"role": "user", "content": [_m_text_block(rng) for _ in range(rng.randint(1, 3))]}


def _m_tool_result(rng: random.Random, tid: str) -> dict:
    b: dict = {"type": "tool_result", "tool_use_id": tid}
    r = rng.random()
    if r < 0.6:
        b["content"] = _text(rng, 0, 8)
    elif r < 0.9:
        b["content"] = [_m_text_block(rng) for _ in range(rng.randint(0, 3))]
    if rng.random() < 0.1:
        b["is_error"] = rng.choice([True, False])
    return b


def _m_input(rng: random.Random) -> Any:
    r = rng.random()
    if r < 0.85:
        return {_key(rng): _json_value(rng, 1) for _ in range(rng.randint(0, 5))}
    return _json_value(rng, 2)


def _m_assistant(rng: random.Random, nxt, names: list[str], allow_tools: bool) -> tuple[dict, list[dict]]:
    if rng.random() < 0.3:
        return {"role": "assistant", "content": _text(rng, 0, 10)}, []
    blocks: list[dict] = []
    for _ in range(rng.choice([0, 0, 1, 1, 2])):
        t: dict = {"type": "thinking", "thinking": _text(rng, 0, 8)}
        if rng.random() < 0.9:
            t["signature"] = "sig" + str(rng.randint(0, 999))
        blocks.append(t)
    for _ in range(rng.choice([0, 1, 1, 2])):
        blocks.append(_m_text_block(rng))
    if rng.random() < 0.15 and len(blocks) > 1:
        rng.shuffle(blocks)  # thinking after text is accepted
    results: list[dict] = []
    if allow_tools and rng.random() < 0.45:
        for _ in range(rng.randint(1, 3)):
            tid = nxt()
            name = rng.choice(names) if names and rng.random() < 0.8 else _tool_name(rng, rng.randint(0, 9))
            blocks.append({"type": "tool_use", "id": tid, "name": name, "input": _m_input(rng)})
            results.append(_m_tool_result(rng, tid))
        rng.shuffle(results)
    if not blocks:
        blocks.append(_m_text_block(rng))
    return {"role": "assistant", "content": blocks}, results


def _m_messages(rng: random.Random, names: list[str]) -> list[dict]:
    nxt = _ids(rng)
    msgs: list[dict] = []
    pending: list[dict] = []
    turns = rng.randint(1, 4)
    for t in range(turns):
        if not pending and rng.random() < 0.06:
            msgs.append({"role": "system", "content": _text(rng, 0, 5) if rng.random() < 0.6 else [_m_text_block(rng)]})
        msgs.append(_m_user(rng, pending))
        pending = []
        for _ in range(rng.choice([0, 0, 0, 1])):
            msgs.append(_m_user(rng))
        last = t == turns - 1
        if last and rng.random() < 0.7:
            break
        a, res = _m_assistant(rng, nxt, names, allow_tools=not last)
        msgs.append(a)
        if not res and not last and rng.random() < 0.1:
            a2, _ = _m_assistant(rng, nxt, names, allow_tools=False)
            msgs.append(a2)
        pending = res
    return msgs


def _one_messages(rng: random.Random) -> dict:
    req: dict = {"model": rng.choice(MODELS)}
    if rng.random() < 0.8:
        req["max_tokens"] = rng.choice([1, 16, 1024, 4096, 393216, 393217, 10**6, rng.randint(1, 100000)])
    thinking_on = True
    r = rng.random()
    typ = None
    if r < 0.5:
        typ = rng.choice(["enabled", "adaptive", "disabled"])
        req["thinking"] = {"type": typ}
        if rng.random() < 0.4:
            req["thinking"]["budget_tokens"] = rng.choice([0, 1024, 2048, rng.randint(1, 50000)])
    elif r < 0.55:
        req["thinking"] = None
    if rng.random() < 0.35:
        e = rng.choice(EFFORTS + [None])
        req["output_config"] = {"effort": e}
    eff = (req.get("output_config") or {}).get("effort")
    if typ is not None:
        thinking_on = typ != "disabled"
    else:
        thinking_on = eff != "none"
    r = rng.random()
    if r < 0.3:
        req["system"] = _text(rng, 0, 10)
    elif r < 0.5:
        req["system"] = [_m_text_block(rng) for _ in range(rng.randint(0, 3))]
    names: list[str] = []
    if rng.random() < 0.5:
        tools = []
        for i in range(rng.randint(0, 4)):
            name = _tool_name(rng, i)
            names.append(name)
            t: dict = {"name": name}
            if rng.random() < 0.6:
                t["description"] = _text(rng, 0, 8)
            t["input_schema"] = _params(rng, False)
            if rng.random() < 0.05:
                t["cache_control"] = {"type": "ephemeral"}
            if rng.random() < 0.05:
                t["strict"] = True
            tools.append(t)
        req["tools"] = tools
        choices = [{"type": "auto"}, {"type": "any"}, {"type": "none"}, None, None]
        if not thinking_on:
            choices += ["named", "named"]
        c = rng.choice(choices)
        if c == "named":
            if names:
                req["tool_choice"] = {"type": "tool", "name": rng.choice(names)}
        elif c is not None:
            req["tool_choice"] = dict(c)
        if "tool_choice" in req and req["tool_choice"]["type"] != "none" and rng.random() < 0.2:
            req["tool_choice"]["disable_parallel_tool_use"] = rng.choice([True, False])
    elif rng.random() < 0.05:
        req["tool_choice"] = {"type": rng.choice(["auto", "any", "none"])}
    req["messages"] = _m_messages(rng, names)
    if rng.random() < 0.2:
        req["stop_sequences"] = [(_text(rng, 1, 2) or "y") for _ in range(rng.randint(0, 16))]
    if rng.random() < 0.3:
        req["temperature"] = rng.choice([0, 0.0, 0.7, 1, 2, rng.uniform(0, 2)])
    if rng.random() < 0.3:
        req["top_p"] = rng.choice([1, 1.0, 0.9, 0.01, rng.uniform(0.001, 1)])
    if rng.random() < 0.15:
        req["top_k"] = rng.choice([0, 1, 40, 500])
    if rng.random() < 0.1:
        req["metadata"] = {"user_id": "u-" + str(rng.randint(0, 99))}
    if rng.random() < 0.1:
        req["stream"] = rng.choice([True, False])
    if rng.random() < 0.05:
        req["x_unknown_field"] = _json_value(rng)
    if rng.random() < 0.3:
        keys = list(req)
        rng.shuffle(keys)
        req = {k: req[k] for k in keys}
    return req


def messages_requests(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    out: list[dict] = []
    while len(out) < n:
        req = _one_messages(rng)
        if "prompt" in recipe_oracle.render_messages(req, "v4.1"):
            out.append(req)
    return out


def _m_mutations(rng: random.Random, req: dict) -> list:
    def setk(k, v):
        def f(r):
            r = copy.deepcopy(r); r[k] = v; return r
        return f

    def delk(k):
        def f(r):
            r = copy.deepcopy(r); r.pop(k, None); return r
        return f

    def msgs(extra):
        def f(r):
            r = copy.deepcopy(r)
            ms = r["messages"]
            if ms and ms[-1]["role"] == "assistant" and extra and extra[0].get("role") == "assistant":
                ms.append({"role": "user", "content": "q"})
            r["messages"] = ms + extra
            return r
        return f

    tu = lambda i, name="f", inp=None: {"type": "tool_use", "id": i, "name": name, "input": inp if inp is not None else {}}
    tr = lambda i: {"type": "tool_result", "tool_use_id": i, "content": "r"}
    A = lambda blocks: {"role": "assistant", "content": blocks}
    U = lambda blocks: {"role": "user", "content": blocks}
    M = []
    M += [delk("model"), setk("model", rng.choice(["claude-sonnet-4", "deepseek-chat", "deepseek-v4-pro", "", 7, None]))]
    M += [delk("messages"), setk("messages", []), setk("messages", rng.choice([{}, None, "hi"]))]
    M += [setk("max_tokens", rng.choice([0, -1, 1.5, "10"])), setk("temperature", rng.choice([-0.5, 2.01, 3, "hot"]))]
    M += [setk("top_p", rng.choice([0, 0.0, -0.1, 1.01, 2])), setk("stop_sequences", rng.choice([["s"] * 17, [""], "x", [1]]))]
    M += [setk("thinking", rng.choice([{"type": "on"}, {}, "enabled", True, {"type": "auto"}])), setk("output_config", rng.choice([{"effort": "extreme"}, {"effort": "HIGH"}, "high"]))]
    M += [setk("system", rng.choice([5, [{"type": "image"}], [{"type": "text"}], ["x"], {"text": "x"}]))]
    M += [setk("tool_choice", rng.choice(["auto", "any", {"type": "tool"}, {"type": "tool", "name": "no_such_tool"}, {"type": "required"}, {}]))]
    bad_tools = rng.choice([
        [{"name": "bad name", "input_schema": {"type": "object"}}],
        [{"name": "", "input_schema": {"type": "object"}}],
        [{"name": "x" * 129, "input_schema": {"type": "object"}}],
        [{"name": "dup", "input_schema": {"type": "object"}}, {"name": "dup", "input_schema": {"type": "object"}}],
        [{"name": "f"}], [{"name": "f", "input_schema": None}],
        [{"name": "f", "input_schema": {"type": "array"}}],
        [{"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "strin"}}}}],
        [{"type": "web_search_20250305", "name": "web_search"}], [{"type": "bash_20250124", "name": "bash"}],
        [{"type": "custom", "name": "f", "input_schema": {"type": "object"}}],
        [{"input_schema": {"type": "object"}}],
        {"a": 1},
    ])
    M += [setk("tools", bad_tools)]
    M += [lambda r: {**copy.deepcopy(r), "thinking": {"type": rng.choice(["enabled", "adaptive"])},
                     "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "f"}}]
    M += [msgs([U([{"type": "text", "text": "x"}]), A([tu("zz1")])]), msgs([A([tu("zz2")]), U("no result")])]
    M += [msgs([A([tu("zz3")]), U([tr("other")])]), msgs([A([tu("zz4")]), U([tr("zz4"), tr("zz4")])])]
    M += [msgs([A([tu("zz5"), tu("zz5")]), U([tr("zz5")])]), msgs([U([tr("zz6")])])]
    M += [msgs([A([tu("zz7"), {"type": "text", "text": "after"}]), U([tr("zz7")])])]
    M += [msgs([A([tu("zz8")]), U([{"type": "text", "text": "first"}, tr("zz8")])])]
    M += [msgs([A([tu("zz9")]), A("mid"), U([tr("zz9")])])]
    M += [msgs([U([{"type": "thinking", "thinking": "t", "signature": "s"}])]), msgs([U([tu("zz10")])]), msgs([A([tr("zz11")])])]
    M += [msgs([U([])]), msgs([A([])])]
    M += [msgs([{"role": rng.choice(["developer", "tool", "function", "User", ""]), "content": "x"}]), msgs([{"role": "user"}])]
    M += [msgs([U(rng.choice([5, None, {"text": "x"}, True]))])]
    M += [msgs([U([rng.choice([{"type": "foo"}, {"type": "text"}, "x", {"text": "x"}, {"type": "redacted_thinking", "data": "d"}, {"type": "tool_reference", "tool_name": "f"}])])])]
    M += [msgs([A([{"type": "tool_use", "id": "q", "name": "f"}]), U([tr("q")])]), msgs([A([{"type": "tool_use", "name": "f", "input": {}}]), U([tr("q")])])]
    M += [msgs([A([{"type": "thinking"}])])]
    M += [lambda r: rng.choice(["{", "not json", "[]", "null", "{\"model\": \"DeepSeek-V4-Pro\"}", "[1]",
                                json.dumps(r, ensure_ascii=False)[:-1], json.dumps(r, ensure_ascii=False) + "x"])]
    return M


def invalid_messages_requests(seed: int, n: int) -> list:
    rng = random.Random(seed)
    out: list = []
    while len(out) < n:
        base = _one_messages(rng)
        body = rng.choice(_m_mutations(rng, base))(base)
        if "status" in recipe_oracle.render_messages(body, "v4.1"):
            out.append(body)
    return out
