"""End to end: `deepinfer serve` driven by the real openai and anthropic SDKs.

Two servers: the tiny full-vocabulary model fixture (real forward passes,
noise answers) and the scripted TEST backend (canned reasoning / tool calls /
stop sequences, chosen by [[script:NAME]] in the prompt).
"""
import concurrent.futures as cf
import json
import socket
import time
import urllib.error
import urllib.request

import anthropic
import openai
import pytest

from serve_util import FIXTURES, Server

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                         "required": ["city"]}}}]


@pytest.fixture(scope="module")
def model_server():
    s = Server("--model", str(FIXTURES / "e2e-v4vocab"), "--threads", "2", "--max-running", "64",
               "--max-batch-tokens", "512")
    yield s
    assert s.stop() == 0, "".join(s.log[-20:])


@pytest.fixture(scope="module")
def scripted():
    s = Server("--backend", "scripted")
    yield s
    assert s.stop() == 0, "".join(s.log[-20:])


def oa(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def an(server):
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=60)


# ----------------------------------------------------------------- the model

def test_chat_nonstream_and_stream_on_the_model(model_server):
    c = oa(model_server)
    r = c.chat.completions.create(model=model_server.model, messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
                                  temperature=0, extra_body={"thinking": {"type": "disabled"}})
    assert r.object == "chat.completion" and r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    text = ""
    chunks = c.chat.completions.create(model=model_server.model, messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
                                       temperature=0, stream=True, stream_options={"include_usage": True},
                                       extra_body={"thinking": {"type": "disabled"}})
    usage = None
    for ch in chunks:
        if ch.choices:
            text += ch.choices[0].delta.content or ""
        if ch.usage:
            usage = ch.usage
    assert usage is not None and usage.completion_tokens == r.usage.completion_tokens
    assert text == (r.choices[0].message.content or "")


def test_responses_and_messages_on_the_model(model_server):
    r = oa(model_server).responses.create(model=model_server.model, input="Hi there", max_output_tokens=6,
                                          reasoning={"effort": "none"}, temperature=0)
    assert r.status in ("completed", "incomplete") and r.usage.output_tokens <= 6
    events = list(oa(model_server).responses.create(model=model_server.model, input="Hi there", max_output_tokens=6,
                                                    reasoning={"effort": "none"}, temperature=0, stream=True))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    m = an(model_server).messages.create(model=model_server.model, max_tokens=6, messages=[{"role": "user", "content": "Hi"}],
                                         thinking={"type": "disabled"}, extra_body={"temperature": 0})
    assert m.type == "message" and m.stop_reason in ("max_tokens", "end_turn") and m.usage.output_tokens <= 6
    with an(model_server).messages.stream(model=model_server.model, max_tokens=6, messages=[{"role": "user", "content": "Hi"}],
                                          thinking={"type": "disabled"}, extra_body={"temperature": 0}) as st:
        final = st.get_final_message()
    assert final.usage.output_tokens == m.usage.output_tokens
    assert "".join(b.text for b in final.content if b.type == "text") == \
        "".join(b.text for b in m.content if b.type == "text")


def _greedy_stream(server, prompt, n=12):
    c = oa(server)
    out = ""
    for ch in c.chat.completions.create(model=server.model, messages=[{"role": "user", "content": prompt}], max_tokens=n,
                                        temperature=0, stream=True, extra_body={"thinking": {"type": "disabled"}}):
        if ch.choices:
            out += ch.choices[0].delta.content or ""
    return out


def test_64_concurrent_streams_equal_their_solo_runs(model_server):
    prompts = [f"Request number {i}: tell me about {'x' * (i % 7)} topic {i * 13}" for i in range(64)]
    solo = {p: _greedy_stream(model_server, p) for p in prompts}
    with cf.ThreadPoolExecutor(64) as ex:
        together = list(ex.map(lambda p: _greedy_stream(model_server, p), prompts))
    assert all(isinstance(t, str) for t in together) and len(together) == 64
    for p, t in zip(prompts, together):
        assert t == solo[p], p


def test_seeded_sampling_is_the_same_on_threads_and_on_the_fast_path(model_server):
    """Seeded sampled requests give the same text whether a step's rows are drawn over several threads with the
    sampler's fast paths (the default server) or on the engine thread alone through the full computation
    (--sample-threads 1, DEEPINFER_SAMPLE_PRUNE=0), and whether they ran together or alone."""
    reqs = [dict(temperature=t, top_p=tp, seed=sd, extra_body={"thinking": {"type": "disabled"}, **kx})
            for sd, (t, tp, kx) in enumerate([(1.0, 1.0, {}), (0.7, 0.9, {}), (1.3, 0.95, {}), (1.0, 1.0, {"top_k": 20}),
                                              (0.8, 0.5, {"min_p": 0.05}), (1.0, 0.99, {"top_k": 500})] * 2)]

    def run(server, i):
        r = oa(server).chat.completions.create(model=server.model, max_tokens=12,
                                               messages=[{"role": "user", "content": f"sample {i}"}], **reqs[i])
        return r.choices[0].message.content

    full = Server("--model", str(FIXTURES / "e2e-v4vocab"), "--threads", "2", "--sample-threads", "1",
                  env={"DEEPINFER_SAMPLE_PRUNE": "0"})
    try:
        alone = [run(full, i) for i in range(len(reqs))]
    finally:
        assert full.stop() == 0, "".join(full.log[-20:])
    with cf.ThreadPoolExecutor(len(reqs)) as ex:
        together = list(ex.map(lambda i: run(model_server, i), range(len(reqs))))
    assert all(isinstance(t, str) and t for t in alone)
    assert together == alone
    assert len(set(alone)) > 1  # the seeds and settings differ, and so do the texts


# ------------------------------------------------------------ scripted output

def test_reasoning_parses_in_sdk_types(scripted):
    r = oa(scripted).chat.completions.create(model=scripted.model, messages=[{"role": "user", "content": "[[script:reasoning]]"}],
                                             extra_body={"thinking": {"type": "enabled"}})
    msg = r.choices[0].message
    assert msg.content == "2 + 2 = 4."
    assert getattr(msg, "reasoning_content", None) or msg.model_extra.get("reasoning_content")
    m = an(scripted).messages.create(model=scripted.model, max_tokens=200, thinking={"type": "enabled", "budget_tokens": 1024},
                                     messages=[{"role": "user", "content": "[[script:reasoning]]"}])
    kinds = [b.type for b in m.content]
    assert kinds == ["thinking", "text"] and m.content[1].text == "2 + 2 = 4."


def test_tool_calls_parse_in_sdk_types(scripted):
    r = oa(scripted).chat.completions.create(model=scripted.model, tools=TOOLS,
                                             messages=[{"role": "user", "content": "[[script:tool]] weather?"}])
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    call = ch.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
    # streamed: argument fragments reassemble to the same JSON
    args, name = "", None
    for c in oa(scripted).chat.completions.create(model=scripted.model, tools=TOOLS, stream=True,
                                                  messages=[{"role": "user", "content": "[[script:tool]]"}]):
        for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            name = name or tc.function.name
            args += tc.function.arguments or ""
    assert name == "get_weather" and json.loads(args) == {"city": "Paris", "days": 3}
    m = an(scripted).messages.create(model=scripted.model, max_tokens=300, tools=[{"name": "get_weather", "description": "w",
                                     "input_schema": TOOLS[0]["function"]["parameters"]}],
                                     messages=[{"role": "user", "content": "[[script:tool]]"}])
    tu = [b for b in m.content if b.type == "tool_use"][0]
    assert m.stop_reason == "tool_use" and tu.name == "get_weather" and tu.input == {"city": "Paris", "days": 3}
    resp = oa(scripted).responses.create(model=scripted.model, input="[[script:tool]]", tools=[{"type": "function",
                                         "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}])
    fc = [o for o in resp.output if o.type == "function_call"][0]
    assert fc.name == "get_weather" and json.loads(fc.arguments) == {"city": "Paris", "days": 3}


def test_stop_sequence_ends_generation(scripted):
    r = oa(scripted).chat.completions.create(model=scripted.model, stop=["STOP"], extra_body={"thinking": {"type": "disabled"}},
                                             messages=[{"role": "user", "content": "[[script:stop]]"}])
    assert r.choices[0].message.content == "one two three " and r.choices[0].finish_reason == "stop"
    m = an(scripted).messages.create(model=scripted.model, max_tokens=100, stop_sequences=["STOP"], thinking={"type": "disabled"},
                                     messages=[{"role": "user", "content": "[[script:stop]]"}])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "STOP"


def test_models_health_metrics(scripted):
    st, body = scripted.get("/v1/models")
    assert st == 200 and json.loads(body)["data"][0]["id"] == "scripted"
    assert scripted.get("/health")[0] == 200
    assert scripted.metric("deepinfer_requests_total") is not None
    assert oa(scripted).models.list().data[0].id == "scripted"


def _metric_line(server, name):
    _, text = server.get("/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_count_a_request_before_its_answer(scripted):
    """/metrics read right after a response (or a stream's last chunk) already counts that request and its
    tokens: on_done runs on the engine thread and counts before it hands the answer to the HTTP loop"""
    ok = 'deepinfer_requests_total{api="chat",status="200"}'
    for stream in (False, True) * 5:
        n0, c0 = _metric_line(scripted, ok), _metric_line(scripted, "deepinfer_completion_tokens_total")
        st, _ = _post(scripted.url + "/v1/chat/completions",
                      {"model": scripted.model, "stream": stream, "thinking": {"type": "disabled"},
                       "messages": [{"role": "user", "content": "[[script:stop]]"}]})
        assert st == 200
        assert _metric_line(scripted, ok) == n0 + 1, stream
        assert _metric_line(scripted, "deepinfer_completion_tokens_total") > c0, stream


# ----------------------------------------------------------------- the queue

def _post(url, body, timeout=60):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_1000_requests_through_a_bounded_queue():
    # 3 ms per step keeps each request in the engine for ~0.3 s, so 64 clients overrun 4 + 8 slots
    s = Server("--backend", "scripted", "--max-running", "4", "--max-waiting", "8", "--quiet",
               "--scripted-step-ms", "3")
    try:
        body = {"model": s.model, "messages": [{"role": "user", "content": "[[script:long]]"}],
                "thinking": {"type": "disabled"}}
        t0 = time.time()
        with cf.ThreadPoolExecutor(64) as ex:
            res = list(ex.map(lambda _: _post(s.url + "/v1/chat/completions", body), range(1000)))
        codes = [c for c, _ in res]
        assert len(codes) == 1000 and set(codes) <= {200, 429}, set(codes)
        assert codes.count(429) > 0 and codes.count(200) > 0
        for c, b in res:
            j = json.loads(b)
            if c == 200:
                assert j["choices"][0]["message"]["content"].startswith("Counting: one")
            else:
                assert "retry" in j["error"]["message"]
        assert time.time() - t0 < 300
        assert s.metric("deepinfer_running_sequences") == 0 and s.metric("deepinfer_waiting_sequences") == 0
    finally:
        assert s.stop() == 0
