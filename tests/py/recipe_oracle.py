"""Reference oracle for Chat Completions -> DeepSeek V4 / V4.1 prompt rendering.

Wraps the PyPI package ``deepseek-recipe==0.2.0`` exactly the way its example
server (``server-py/main.py`` upstream) does:

    request   = ChatCompletionRequest(body)          # ValueError -> 400
    converted = request.convert(ConversionOptions()) # ConversionError(status_code, body)
    prompt    = DeepseekV4Encoding()/DeepseekV41Encoding().render_conversation(
                    converted.conversation).prompt

Error reporting in 0.2.0 (checked):

* Body deserialization failures (malformed JSON, missing required field, wrong
  JSON type, unknown role / enum variant) are raised by the
  ``ChatCompletionRequest`` *constructor* as a plain ``ValueError`` whose
  ``str()`` is e.g. ``invalid request body: missing field `messages``` or
  ``invalid JSON request: expected ident at line 1 column 2``.  The package
  attaches no status/body; the upstream server maps it to HTTP 400 with the
  standard body, using ``str(error)`` as the message.  We do the same.
* Semantic validation failures are raised by ``convert`` as
  ``deepseek_recipe.ConversionError`` with ``.status_code`` (int; 400 for
  every Chat Completions case we found) and ``.body`` (a compact JSON string:
  ``{"error":{"message":M,"type":"invalid_request_error","param":null,
  "code":"invalid_request_error"}}``).  ``.args[0]`` is the bare message.

Either way the oracle returns ``{"status": int, "error": <parsed body dict>}``
where the dict is the full body, i.e. ``{"error": {...}}``.

Encoding does not depend on the request's model name as far as this oracle is
concerned: the caller picks "v4" or "v4.1".  The model name must still be one
of ``ConversionOptions().model_versions_by_name`` keys ("DeepSeek-V4-Pro",
"DeepSeek-V4.1-Flash"), otherwise conversion fails with 400.
"""

from __future__ import annotations

import functools
import json
import pathlib
from typing import Any

import deepseek_recipe as dr

ROOT = pathlib.Path(__file__).resolve().parents[2]
V4_TOKENIZER = ROOT / "assets" / "tokenizers" / "deepseek-v4" / "tokenizer.json"

MODEL_NAMES = {"DeepSeek-V4-Pro": "v4", "DeepSeek-V4.1-Flash": "v4.1"}

ENCODINGS = {"v4": dr.DeepseekV4Encoding, "v4.1": dr.DeepseekV41Encoding}


def _error_body(message: str, status: int) -> dict:
    kind = "internal_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": kind}}


def convert(request: Any, options: "dr.ConversionOptions | None" = None):
    """Return (ConversationRequest, None) or (None, {"status", "error"})."""
    if isinstance(request, dict):
        # Serialize ourselves so duplicate-key / float formatting tests can pass
        # raw text instead (str/bytes bodies are passed through unchanged).
        body: Any = json.dumps(request, ensure_ascii=False)
    else:
        body = request
    try:
        req = dr.ChatCompletionRequest(body)
    except ValueError as e:
        return None, {"status": 400, "error": _error_body(str(e), 400)}
    try:
        conv = req.convert(options if options is not None else dr.ConversionOptions())
    except dr.ConversionError as e:
        return None, {"status": int(e.status_code), "error": json.loads(e.body)}
    return conv, None


@functools.lru_cache(maxsize=None)
def _encoder(encoding: str, with_tok: bool):
    enc = ENCODINGS[encoding]()
    if with_tok:
        enc = enc.with_tokenizer(dr.Tokenizer.from_file(str(V4_TOKENIZER)))
    return enc


def render_chat(request: Any, encoding: str, *, ids: bool = False) -> dict:
    """Render a Chat Completions request body (dict, or raw JSON str/bytes).

    Returns {"prompt": str} (plus "ids": [...] when ids=True, encoded with the
    V4 tokenizer at assets/tokenizers/deepseek-v4) or {"status": int,
    "error": {"error": {...}}}.
    """
    conv, err = convert(request)
    if err is not None:
        return err
    out: dict = {"prompt": _encoder(encoding, False).render_conversation(conv.conversation).prompt}
    if ids:
        out["ids"] = _encoder(encoding, True).encode(conv.conversation)
    return out


def conversion_facts(request: Any) -> dict:
    """Non-prompt facts of a converted request (for debugging / docs)."""
    conv, err = convert(request)
    if err is not None:
        return err
    c = conv.conversation
    io = conv.inference_options
    po = conv.parsing_options
    return {
        "model_version": str(conv.model_version),
        "thinking_mode": c.thinking_mode,
        "reasoning_effort": c.reasoning_effort,
        "tool_choice": c.tool_choice,
        "response_format": c.response_format,
        "tools": [t.name for t in c.tools],
        "max_tokens": io.max_tokens,
        "temperature": io.temperature,
        "top_p": io.top_p,
        "stop": list(po.stop_sequences),
        "parse_tool_calls": po.parse_tool_calls,
        "starts_in_tool_calls": po.starts_in_tool_calls,
        "parse_json_output": po.parse_json_output,
        "stream": conv.stream,
    }


# Facts the C side needs (checked against 0.2.0; see docs/RECIPE.md).
CONVERSION_OPTIONS_DEFAULTS = {
    "default_thinking_mode": True,
    "reasoning_content_behavior": "FillEmpty",
    "thinking_max_tokens_upper_bound": 393216,
    "non_thinking_max_tokens_upper_bound": 393216,
    "model_versions_by_name": {"DeepSeek-V4-Pro": "DeepseekV4Pro", "DeepSeek-V4.1-Flash": "DeepseekV41Flash"},
}


# ---------------------------------------------------------------------------- Responses / Messages
#
# Same pipeline and return contract as render_chat, with ResponsesRequest / MessagesRequest in place of
# ChatCompletionRequest (see docs/RECIPE-RM.md).  Error reporting in 0.2.0 (checked) is identical for both
# APIs and identical to Chat: the constructor raises a plain ValueError for deserialization failures (we map
# it to 400 + the standard body, like the upstream server), and convert raises ConversionError whose .body
# is the *OpenAI-style* body {"error":{"message","type","param","code"}} -- also for Anthropic Messages (no
# {"type":"error","error":{"type":...}} shape).  Every status observed is 400.

def _convert_with(cls, request: Any, options: "dr.ConversionOptions | None" = None):
    if isinstance(request, dict):
        body: Any = json.dumps(request, ensure_ascii=False)
    else:
        body = request
    try:
        req = cls(body)
    except ValueError as e:
        return None, {"status": 400, "error": _error_body(str(e), 400)}
    try:
        conv = req.convert(options if options is not None else dr.ConversionOptions())
    except dr.ConversionError as e:
        return None, {"status": int(e.status_code), "error": json.loads(e.body)}
    return conv, None


def convert_responses(request: Any, options: "dr.ConversionOptions | None" = None):
    """Return (ConversationRequest, None) or (None, {"status", "error"}) for a Responses body."""
    return _convert_with(dr.ResponsesRequest, request, options)


def convert_messages(request: Any, options: "dr.ConversionOptions | None" = None):
    """Return (ConversationRequest, None) or (None, {"status", "error"}) for an Anthropic Messages body."""
    return _convert_with(dr.MessagesRequest, request, options)


def _render_converted(conv, err, encoding: str, ids: bool) -> dict:
    if err is not None:
        return err
    out: dict = {"prompt": _encoder(encoding, False).render_conversation(conv.conversation).prompt}
    if ids:
        out["ids"] = _encoder(encoding, True).encode(conv.conversation)
    return out


def render_responses(request: Any, encoding: str, *, ids: bool = False) -> dict:
    """Render an OpenAI Responses request body (dict, or raw JSON str/bytes); contract as render_chat."""
    conv, err = convert_responses(request)
    return _render_converted(conv, err, encoding, ids)


def render_messages(request: Any, encoding: str, *, ids: bool = False) -> dict:
    """Render an Anthropic Messages request body (dict, or raw JSON str/bytes); contract as render_chat."""
    conv, err = convert_messages(request)
    return _render_converted(conv, err, encoding, ids)


RENDERERS = {"chat": render_chat, "responses": render_responses, "messages": render_messages}


def conversation_dump(conv) -> dict:
    """A comparable dump of a converted Conversation (messages + prompt-relevant settings)."""
    c = conv.conversation
    msgs = []
    for m in c.messages:
        d: dict = {"role": m.role, "content": m.content}
        if m.reasoning_content is not None:
            d["reasoning_content"] = m.reasoning_content
        if m.tool_calls is not None:
            d["tool_calls"] = [(t.id, t.name, t.arguments) for t in m.tool_calls]
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.prefix:
            d["prefix"] = True
        msgs.append(d)
    return {
        "messages": msgs,
        "thinking_mode": c.thinking_mode,
        "reasoning_effort": c.reasoning_effort,
        "tool_choice": c.tool_choice,
        "response_format": c.response_format,
        "response_schema": json.dumps(c.response_schema) if c.response_schema is not None else None,
        "response_regex": c.response_regex,
        "tools": [(t.name, t.description, json.dumps(t.parameters), t.strict) for t in c.tools],
    }
