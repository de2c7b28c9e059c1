#!/usr/bin/env python3
"""Codec benchmark: ours vs deepseek-recipe 0.2.0, measured in one run.

1. Output parsing: model outputs (reasoning, content, DSML tool calls) through the state machine and
   the Chat SSE writer, at token-sized (4 byte) and 4 KiB chunks, vs the package's StreamProcessor
   with a Chat chunk generator on the same outputs and chunks.
2. Request -> prompt -> token ids for a ~77K-token agent conversation (Chat Completions, V4 encoding,
   V4 tokenizer): ours on 1 and 2 threads vs the package's convert + encode.
usage: python3 bench/recipe.py [--outputs-mb 2]
"""
import argparse
import json
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "py"))
TOK = ROOT / "assets/tokenizers/deepseek-v4/tokenizer.json"
BIN = ROOT / "build/bench_recipe"
DSML = "\uff5cDSML\uff5c"


def prose(r, texts, n):
    t = r.choice(texts)
    a = r.randrange(max(1, len(t) - n))
    return t[a:a + n]


def outputs(mb):
    from corpus import _stdlib_texts
    r = random.Random(7)
    texts = _stdlib_texts()
    out, size = [], 0
    while size < mb * 2**20:
        s = prose(r, texts, r.randint(500, 6000)) + "\n</think>\n\n" + prose(r, texts, r.randint(200, 3000))
        if r.random() < 0.5:
            calls = "".join(
                f'<{DSML}invoke name="run_{k}">\n<{DSML}parameter name="path" string="true">{prose(r, texts, 200)}'
                f'</{DSML}parameter>\n<{DSML}parameter name="n" string="false">{{"a": [1, 2]}}</{DSML}parameter>\n'
                f'</{DSML}invoke>\n' for k in range(r.randint(1, 3)))
            s += f"\n\n<{DSML}tool_calls>\n{calls}</{DSML}tool_calls>"
        out.append(s)
        size += len(s.encode())
    return out


def agent_request(target_tokens=77_000):
    from corpus import _stdlib_texts, _rand_json
    r = random.Random(11)
    texts = _stdlib_texts()
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": prose(r, texts, 300),
              "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"}},
                             "required": ["path"]}}} for i in range(12)]
    msgs = [{"role": "system", "content": prose(r, texts, 4000)}]
    body = {"model": "DeepSeek-V4-Pro", "thinking": {"type": "enabled"}, "tools": tools, "messages": msgs}
    k = 0
    while len(json.dumps(body)) < target_tokens * 3.9:
        msgs.append({"role": "user", "content": prose(r, texts, 600)})
        msgs.append({"role": "assistant", "content": "", "reasoning_content": prose(r, texts, 400),
                     "tool_calls": [{"id": f"c{k}", "type": "function", "function": {
                         "name": f"tool_{k % 12}", "arguments": json.dumps({"path": prose(r, texts, 60), "n": k})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": prose(r, texts, 4000)})
        k += 1
    msgs.append({"role": "user", "content": "Continue."})
    return body


def package_parse(req, outs, chunk):
    """The package's processor + Chat chunk generator, each chunk serialised as an SSE event would be."""
    import deepseek_recipe as dr
    conv = dr.ChatCompletionRequest(req).convert(dr.ConversionOptions())
    t0 = time.perf_counter()
    n = 0
    for s in outs:
        gen = dr.ChatCompletionRequest.chunk_generator(conv, "chatcmpl-bench", req["model"])
        proc = dr.StreamProcessor(gen, conv.parsing_options)
        got = proc.push(dr.InferenceChunk.ready(
            prompt_usage=dr.PromptUsage(prompt_tokens=1, prompt_cache_hit_tokens=0), system_fingerprint="fp"))
        for a in range(0, len(s), chunk):
            got += proc.push(dr.InferenceChunk.text(s[a:a + chunk], 1))
        got += proc.push(dr.InferenceChunk.finish(dr.InferenceFinishReason.Stop))
        got += proc.finish()
        proc.close()
        n += sum(len(c.to_json()) for c in got)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--outputs-mb", type=float, default=2)
    args = ap.parse_args()
    import deepseek_recipe as dr
    outs = outputs(args.outputs_mb)
    nbytes = sum(len(s.encode()) for s in outs)
    req = {"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "hi"}],
           "tools": [{"type": "function", "function": {"name": "run_0", "parameters": {"type": "object"}}}],
           "stream": True}
    with tempfile.TemporaryDirectory() as d:
        rq, of = pathlib.Path(d, "req.json"), pathlib.Path(d, "outs.jsonl")
        rq.write_text(json.dumps(req))
        of.write_text("".join(json.dumps(s) + "\n" for s in outs))
        print(f"output parsing: {len(outs)} outputs, {nbytes / 1e6:.1f} MB (reasoning, content, DSML tool calls)")
        print(f"{'':40} {'chunk':>6} {'MB/s':>9} {'vs package':>11}")
        for chunk in (4, 4096):
            ref = min(package_parse(req, outs, chunk) for _ in range(2))
            o = json.loads(subprocess.run([str(BIN), "parse", str(rq), str(of), str(chunk)], check=True,
                                          capture_output=True, text=True).stdout)
            print(f"{'deepseek-recipe processor + Chat chunks':40} {chunk:6} {nbytes / ref / 1e6:9.1f} {1.0:10.2f}x")
            print(f"{'deepinfer state machine':40} {chunk:6} {nbytes / o['sm_s'] / 1e6:9.1f} {ref / o['sm_s']:10.2f}x")
            print(f"{'deepinfer state machine + Chat SSE':40} {chunk:6} {nbytes / o['sse_s'] / 1e6:9.1f} "
                  f"{ref / o['sse_s']:10.2f}x")
        body = agent_request()
        rq.write_text(json.dumps(body))
        tok = dr.Tokenizer.from_file(str(TOK))
        enc = dr.DeepseekV4Encoding().with_tokenizer(tok)
        v = []
        for _ in range(5):
            t0 = time.perf_counter()
            conv = dr.ChatCompletionRequest(body).convert(dr.ConversionOptions())
            ids = enc.encode(conv.conversation)
            v.append(time.perf_counter() - t0)
        ref = statistics.median(v)
        print()
        print(f"request -> prompt -> ids: {len(body['messages'])} messages, {len(ids)} tokens")
        print(f"{'':40} {'ms':>9} {'vs package':>11}")
        print(f"{'deepseek-recipe convert + encode':40} {ref * 1e3:9.2f} {1.0:10.2f}x")
        for th in (1, 2):
            o = json.loads(subprocess.run([str(BIN), "render", str(rq), str(TOK), str(th)], check=True,
                                          capture_output=True, text=True).stdout)
            assert o["ids"] == len(ids), (o["ids"], len(ids))
            print(f"{'deepinfer, %d thread%s (median)' % (th, 's' if th > 1 else ''):40} {o['median_s'] * 1e3:9.2f} "
                  f"{ref / o['median_s']:10.2f}x")


if __name__ == "__main__":
    main()
