"""Deterministic random model outputs for the Chat Completions output-side oracle.

* ``chat_cases(seed, n)``   -> n case dicts: {"kind", "request", "text", "encoding", "finish",
                               "prompt_tokens", "cached_tokens"}; every request is accepted by
                               deepseek-recipe 0.2.0 (checked here).
* ``chat_outputs(seed, n)`` -> the (request, model_output_text) pairs of ``chat_cases``.
* ``chunkings(text, seed, k)`` -> k distinct chunk splits of ``text``.

Text chunks are Python ``str`` (0.2.0's ``InferenceChunk.text`` takes a Rust ``String``, i.e.
whole UTF-8), so splits fall on code-point boundaries: the finest split is one code point
per chunk, which is one byte per chunk for ASCII text.  Splitting inside a multi-byte
character is only possible with token-id input (see docs/STREAM.md).

``model_output_text`` is what the backend generates after the prompt (after the trailing
``<think>`` / ``</think>``, or after the forced ``\\n\\n<｜DSML｜ calls>\\n`` of a required
tool choice); EOS is not part of it (``finish`` = "stop" models EOS).
"""

from __future__ import annotations

import json
import random
from typing import Any

import deepseek_recipe as dr

MODELS = {"v4": "DeepSeek-V4-Pro", "v4.1": "DeepSeek-V4.1-Flash"}
DSML = "｜DSML｜"

WORDS = [
    "hello", "world", "Paris", "東京", "中文", "données", "emoji😀", "🦀", "a", "the", "x",
    "\n", "\n\n", " ", "  ", "\t", "\\", "\"", "'", "{", "}", "[", "]", "<", ">", "</", "<b>",
    "&amp;", "\u00a0", "\u2028", "\x01", "\x7f", "```", "`", "json", "STOP", "ST", "end",
    "</thi", "<think>", "｜", "<｜", "DSML", "null", "1.5", "-0", "```json", "\r\n",
]
MARKERS = ["</think>", "<｜DSML｜", "</｜DSML｜", "```json\n", "```\n", "\n```", "invoke name=\"",
           "parameter name=", " calls>", "tool_calls>", "true\">", "false\">"]
STOP_POOL = ["STOP", "\n\n", "end", "</", "中文", "<｜", "}", "\"", "x", "🦀", "ST", "STOP!", "Paris", "``"]
PARAM_NAMES = ["city", "query", "n", "opts", "deep_list", "名字", "é", "k-q", "flag", "value", "a", "b",
               "shipping address", "", "x\"y", "back\\slash"]


def _text(rng: random.Random, lo: int = 0, hi: int = 10, extra: list[str] | None = None) -> str:
    pool = WORDS + (extra or [])
    return "".join(rng.choice(pool) if rng.random() < 0.6 else rng.choice([" ", "", "\n"]) + rng.choice(pool)
                   for _ in range(rng.randint(lo, hi)))


def _plain(rng: random.Random, lo: int = 0, hi: int = 10) -> str:
    """Text without markers that the parser would interpret."""
    t = _text(rng, lo, hi)
    for m in ("</think>", "<｜DSML｜", "</｜DSML｜"):
        t = t.replace(m, "")
    return t


def _json_value(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth < 3 and r < 0.25:
        return {rng.choice(["a", "b", "名", "k\"q", "x\\y", "n"]): _json_value(rng, depth + 1)
                for _ in range(rng.randint(0, 3))}
    if depth < 3 and r < 0.45:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return rng.choice([0, 1, -7, 2.5, -1.25e4, 1e-7, True, False, None, "s", "中文 \"q\"", "a\\b\n", "😀", ""])


def _json_text(rng: random.Random, v: Any) -> str:
    sep = rng.choice([(", ", ": "), (",", ":"), (", ", ":")])
    return json.dumps(v, ensure_ascii=rng.random() < 0.2, separators=sep)


def _string_value(rng: random.Random) -> str:
    return rng.choice([
        lambda: _plain(rng, 0, 6),
        lambda: "Paris",
        lambda: "",
        lambda: "line1\nline2\r\n\ttab \"quoted\" back\\slash \x01\x1f\x7f",
        lambda: "日本語 😀🦀 \u2028\u2029 é",
        lambda: "*** Begin Patch\n*** Add File: hello.txt\n+Hello, 世界 😀\n*** End Patch",
        lambda: "<tag attr=\"x\">&lt;</tag> </think> ``` ",
        lambda: "STOP inside argument",
        lambda: json.dumps({"nested": ["json", 1]}),
    ])()


def _spell(v41: bool) -> tuple[str, str, str, str]:
    if v41:
        return " calls", " invoke", " parameter", " "
    return "tool_calls", "invoke", "parameter", ""


def _call(rng: random.Random, v41: bool, names: list[str]) -> str:
    _, inv, par, _ = _spell(v41)
    name = rng.choice(names) if rng.random() < 0.9 else rng.choice(["unknown_tool", "名前", "we\\ird"])
    out = [f"<{DSML}{inv} name=\"{name}\">\n"]
    for _ in range(rng.choice([0, 1, 1, 2, 3, 4])):
        pname = rng.choice(PARAM_NAMES) if rng.random() < 0.3 else rng.choice(PARAM_NAMES[:11])
        if rng.random() < 0.5:
            val, s = _string_value(rng), "true"
        else:
            val, s = _json_text(rng, _json_value(rng)), "false"
        out.append(f"<{DSML}{par} name=\"{pname}\" string=\"{s}\">{val}</{DSML}{par}>\n")
    out.append(f"</{DSML}{inv}>\n")
    return "".join(out)


def _block(rng: random.Random, v41: bool, names: list[str], forced: bool = False) -> str:
    blk, _, _, _ = _spell(v41)
    calls = "".join(_call(rng, v41, names) for _ in range(rng.choice([1, 1, 1, 2, 3])))
    head = "" if forced else f"<{DSML}{blk}>\n"
    return head + calls + f"</{DSML}{blk}>"


def _mutate(rng: random.Random, t: str) -> str:
    """Malformed DSML: delete / duplicate / replace a random slice, or corrupt an attribute."""
    for _ in range(rng.randint(1, 3)):
        r = rng.random()
        if not t:
            break
        i = rng.randrange(len(t))
        j = min(len(t), i + rng.randint(1, 12))
        if r < 0.3:
            t = t[:i] + t[j:]
        elif r < 0.5:
            t = t[:j] + t[i:j] + t[j:]
        elif r < 0.7:
            t = t[:i] + rng.choice(MARKERS + ["\"", ">", "<", " ", "\n"]) + t[i:]
        elif r < 0.85:
            t = t.replace("string=\"true\"", rng.choice(["string=\"yes\"", "string=true", "", "string=\"TRUE\""]), 1)
        else:
            t = t.replace("name=\"", rng.choice(["name=", "name =\"", "name=\" ", "name=\"\""]), 1)
    return t


def _tools(rng: random.Random) -> tuple[list[dict], list[str]]:
    names = rng.sample(["get_weather", "search", "f", "lookup", "apply_patch", "run-cmd", "g2"], rng.randint(1, 3))
    tools = []
    for nm in names:
        tools.append({"type": "function", "function": {
            "name": nm, "description": "d",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
    return tools, names


def _stops(rng: random.Random, text: str) -> list[str]:
    stops = []
    for _ in range(rng.randint(1, 3)):
        if text and rng.random() < 0.6:
            i = rng.randrange(len(text))
            s = text[i:i + rng.randint(1, 6)]
        else:
            s = rng.choice(STOP_POOL)
        if s and s not in stops:
            stops.append(s)
    return stops or ["STOP"]


def _content(rng: random.Random) -> str:
    t = _plain(rng, 0, 12)
    if rng.random() < 0.3:
        t = "\n" * rng.randint(1, 3) + t
    if rng.random() < 0.2:
        t += "\n" * rng.randint(1, 2)
    return t


def _one(rng: random.Random, kind: str) -> dict:
    enc = rng.choice(["v4", "v4.1"])
    v41 = (enc == "v4.1") if rng.random() < 0.75 else (enc != "v4.1")
    req: dict = {"model": MODELS[enc] if rng.random() < 0.8 else MODELS[rng.choice(["v4", "v4.1"])],
                 "messages": [{"role": "user", "content": "Please answer in json. " + _plain(rng, 0, 3)}]}
    think = kind in ("reasoning", "reasoning_tools") or (kind in ("content", "stop", "json", "malformed", "tools")
                                                         and rng.random() < 0.35)
    if not think:
        req["thinking"] = {"type": "disabled"}
    elif rng.random() < 0.3:
        req["reasoning_effort"] = rng.choice(["high", "max", "low"])
    names: list[str] = []
    if kind in ("tools", "reasoning_tools", "required", "malformed") or rng.random() < 0.2:
        req["tools"], names = _tools(rng)
    reasoning = ""
    if think:
        reasoning = "\n" * rng.choice([0, 0, 1, 2]) + _plain(rng, 0, 10) + "\n" * rng.choice([0, 1, 2])
        if rng.random() < 0.3:
            reasoning += rng.choice(["STOP", "<think>", "</thi", "```json\n{}\n```"])
    text = ""
    if kind == "content":
        text = _content(rng)
    elif kind == "stray_think":
        text = _content(rng) + "</think>" + "\n" * rng.randint(0, 2) + _content(rng)
        if rng.random() < 0.5:
            text = "</think>" + text
    elif kind == "reasoning":
        text = _content(rng)
    elif kind in ("tools", "reasoning_tools"):
        pre = _plain(rng, 0, 5) if rng.random() < 0.6 else ""
        text = pre + "\n" * rng.choice([0, 1, 2, 2]) + _block(rng, v41, names)
        if rng.random() < 0.4:
            text += rng.choice(["trailing", "\n", " more text </think>", "<｜DSML｜ calls>again"])
    elif kind == "required":
        req["tool_choice"] = "required" if rng.random() < 0.7 else {"type": "function", "function": {"name": names[0]}}
        req["thinking"] = {"type": "disabled"}
        req.pop("reasoning_effort", None)
        reasoning = ""
        text = _block(rng, v41, names, forced=True)
        if rng.random() < 0.2:
            text = _plain(rng, 1, 3) + text
    elif kind == "stop":
        text = _content(rng) + rng.choice(["", "STOP", "\n\n", "中文", "end"]) + _content(rng)
    elif kind == "json":
        req["response_format"] = {"type": "json_object"}
        body = _json_text(rng, _json_value(rng)) if rng.random() < 0.8 else _plain(rng, 0, 3)
        style = rng.randrange(5)
        if style == 0:
            text = _plain(rng, 0, 3) + "```json\n" + body + "\n```" + _plain(rng, 0, 3)
        elif style == 1:
            text = "```\n" + body + "\n```\n"
        elif style == 2:
            text = "\n" * rng.randint(0, 2) + body
        elif style == 3:
            text = _plain(rng, 0, 4) + " " + body + " " + _plain(rng, 0, 2)
        else:
            text = _plain(rng, 0, 5)
        if names and rng.random() < 0.5:
            text += "\n\n" + _block(rng, v41, names)
    elif kind == "malformed":
        text = _mutate(rng, (_plain(rng, 0, 3) + "\n\n" if rng.random() < 0.5 else "") + _block(rng, v41, names))
    if think:
        if kind == "reasoning_tools":
            text = reasoning + ("</think>\n\n" + _plain(rng, 0, 3) if rng.random() < 0.3 else "") + "\n\n" + text
        else:
            text = reasoning + "\n" * rng.choice([0, 1]) + "</think>" + "\n" * rng.choice([0, 1, 2]) + text
    if kind == "stop" or (kind in ("json", "tools", "reasoning", "content") and rng.random() < 0.25):
        stops = _stops(rng, text)
        req["stop"] = stops if len(stops) > 1 or rng.random() < 0.5 else stops[0]
    if kind in ("reasoning", "content") and "tools" not in req and rng.random() < 0.2:
        # assistant prefix continuation: ReasoningContinuation / ContentContinuation / ReasoningStart
        pre = {"role": "assistant", "content": rng.choice(["", "Partial answer"]), "prefix": True}
        if think and rng.random() < 0.7:
            pre["reasoning_content"] = rng.choice(["", "some thoughts"])
        req["messages"].append(pre)
    finish: str | None = rng.choice(["stop", "stop", "stop", "length", None])
    if rng.random() < 0.15 and text:
        text = text[:rng.randrange(len(text))]
        finish = "length"
    if rng.random() < 0.03:
        finish = "content_filter"
    if rng.random() < 0.5:
        req["stream_options"] = {"include_usage": rng.random() < 0.5}
    prompt = rng.randint(1, 5000)
    return {"kind": kind, "request": req, "text": text, "encoding": enc, "finish": finish,
            "prompt_tokens": prompt, "cached_tokens": rng.choice([0, 0, prompt, rng.randint(0, prompt)])}


KINDS = ["content", "reasoning", "stray_think", "tools", "reasoning_tools", "required", "stop", "json",
         "malformed"]


def _accepted(req: dict) -> bool:
    for stream in (False, True):
        body = dict(req, stream=stream)
        if not stream:
            body.pop("stream_options", None)
        try:
            dr.ChatCompletionRequest(body).convert(dr.ConversionOptions())
        except (ValueError, dr.ConversionError):
            return False
    return True


def chat_cases(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        case = _one(rng, KINDS[len(out) % len(KINDS)])
        if not _accepted(case["request"]):
            raise AssertionError(f"generated request rejected by 0.2.0: {case['request']}")
        out.append(case)
    return out


def chat_outputs(seed: int, n: int) -> list[tuple[dict, str]]:
    return [(c["request"], c["text"]) for c in chat_cases(seed, n)]


# ---------------------------------------------------------------------------------------------


def _split(text: str, cuts: set[int]) -> list[str]:
    pts = sorted(c for c in cuts if 0 < c < len(text))
    out, prev = [], 0
    for p in pts:
        out.append(text[prev:p])
        prev = p
    out.append(text[prev:])
    return out


def chunkings(text: str, seed: int, k: int) -> list[list[str]]:
    """k distinct splits of ``text`` into code-point chunks.

    Always starts with [whole text] and [one code point per chunk]; for k >= 6 the third is a
    coarse split with empty chunks ("") interleaved; then splits that cut
    inside every occurrence of a parser marker or stop-like string, every-2-way splits
    around interesting positions, and random partitions of varying density.  Fewer than k
    are returned only when the text has fewer distinct splits.  ``text == ""`` gives [[]]
    (no text chunk at all) plus [[""]] (one empty chunk).
    """
    if text == "":
        return [[], [""]][:max(1, k)]
    rng = random.Random(seed)
    seen: set[tuple[str, ...]] = set()
    out: list[list[str]] = []

    def add(ch: list[str]) -> None:
        t = tuple(ch)
        if t not in seen and len(out) < k:
            assert "".join(ch) == text
            seen.add(t)
            out.append(ch)

    add([text])
    add(list(text))
    if k >= 6:
        # empty chunks are legal backend chunks and have observable effects (docs/STREAM.md)
        base = _split(text, {rng.randint(1, max(1, len(text) - 1)) for _ in range(3)})
        withe: list[str] = [""] if rng.random() < 0.5 else []
        for c in base:
            withe.append(c)
            if rng.random() < 0.7:
                withe.append("")
        add(withe)
    # cuts inside markers
    inner: list[int] = []
    for m in MARKERS + STOP_POOL:
        start = text.find(m)
        while start != -1:
            if len(m) > 1:
                inner.append(start + rng.randint(1, len(m) - 1))
            inner.append(start)
            inner.append(start + len(m))
            start = text.find(m, start + 1)
    if inner:
        add(_split(text, set(inner)))
    n = len(text)
    attempts = 0
    while len(out) < k and attempts < 20 * k:
        attempts += 1
        r = rng.random()
        if r < 0.25 and inner:
            add(_split(text, {rng.choice(inner)}))
        elif r < 0.4:
            add(_split(text, {rng.randint(1, max(1, n - 1))}))
        else:
            density = rng.choice([0.02, 0.1, 0.3, 0.6, 0.9])
            add(_split(text, {i for i in range(1, n) if rng.random() < density}))
    return out
