"""Differential tests: our tokenizer against HF `tokenizers` (the reference).

- content mode  == HF with every added token removed from the tokenizer (so
  nothing, special or not, is matched as a control token: this is what "special
  token splitting disabled" must mean for V4, whose <｜User｜>, <think> ... are
  added tokens with special=false and would still be split by HF's
  encode_special_tokens switch);
- template mode == HF's normal encode (add_special_tokens=False; these
  tokenizers' post-processor adds nothing anyway);
- decode(encode(x)) == x, and decode of random id sequences == HF decode.

Corpus size: DEEPINFER_DIFF_MB (default 20) megabytes per tokenizer, split
between the two modes.  Zero mismatches allowed.
"""
import json
import os
import random
import subprocess

import pytest
from tokenizers import Tokenizer

from conftest import TOKENIZERS
from corpus import documents

MB = float(os.environ.get("DEEPINFER_DIFF_MB", "20"))


def hf_pair(path):
    spec = json.load(open(path, encoding="utf-8"))
    full = Tokenizer.from_str(json.dumps(spec))
    plain = dict(spec)
    plain["added_tokens"] = []
    return full, Tokenizer.from_str(json.dumps(plain)), [t["content"] for t in spec["added_tokens"]]


def run_jsonl(cmd, lines):
    p = subprocess.run(cmd, input="".join(lines).encode(), capture_output=True, check=False)
    out = p.stdout.decode().split("\n")[:-1]  # not splitlines(): U+2028 is legal inside JSON
    assert len(out) == len(lines), p.stderr.decode()[-2000:]
    return [json.loads(x) for x in out]


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


@pytest.mark.parametrize("name", ["v3", "v4"])
@pytest.mark.parametrize("mode", ["content", "template"])
def test_encode_matches_hf(deepinfer, name, mode):
    full, plain, added = hf_pair(TOKENIZERS[name])
    hf = plain if mode == "content" else full
    seed = {"v3": 1, "v4": 2}[name] * 10 + (mode == "template")
    docs = list(documents(seed, int(MB * 2**20 / 2), added))
    nbytes = sum(len(d.encode()) for d in docs)
    assert nbytes >= MB * 2**20 / 2
    want = [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)]
    cmd = [deepinfer, "tokenize", "--tokenizer", str(TOKENIZERS[name]), "--jsonl"]
    if mode == "template":
        cmd.append("--template")
    # half the documents through the parallel path: same ids required
    got = run_jsonl(cmd, [json.dumps(d) + "\n" for d in docs[::2]])
    got_par = run_jsonl(cmd + ["--threads", "3"], [json.dumps(d) + "\n" for d in docs[1::2]])
    got_all = [None] * len(docs)
    got_all[::2], got_all[1::2] = got, got_par
    bad = [i for i, (g, w) in enumerate(zip(got_all, want)) if g != w]
    if bad:
        i = bad[0]
        k = first_diff(got_all[i], want[i])
        pytest.fail(f"{len(bad)}/{len(docs)} documents differ; first: doc {i} at id {k}: "
                    f"ours {got_all[i][k:k+8]} hf {want[i][k:k+8]}; text near: "
                    f"{hf.decode(want[i][max(0,k-4):k+8])!r}")
    ids = [i for doc in want for i in doc]
    if mode == "content":
        specials = {full.token_to_id(a) for a in added}
        assert not specials & set(ids), "content mode produced a control token id"
    print(f"{name}/{mode}: {len(docs)} docs, {nbytes/2**20:.1f} MiB, {len(ids)} ids, 0 mismatches")
    # round trip through our decoder
    dec_cmd = [deepinfer, "detokenize", "--tokenizer", str(TOKENIZERS[name]), "--jsonl", "--added"]
    back = run_jsonl(dec_cmd, [json.dumps(g) + "\n" for g in got_all[:400]])
    for d, b in zip(docs, back):
        assert b == d


@pytest.mark.parametrize("name", ["v3", "v4"])
def test_decode_random_ids_matches_hf(deepinfer, name):
    full, _plain, _added = hf_pair(TOKENIZERS[name])
    n = full.get_vocab_size(with_added_tokens=True)
    r = random.Random(7)
    seqs = []
    for _ in range(3000):
        # mostly single-byte ids (0..~300) so that broken UTF-8 is common
        seqs.append([r.randrange(3, 400) if r.random() < 0.5 else r.randrange(n) for _ in range(r.randint(0, 30))])
    valid = [[i for i in s if full.id_to_token(i) is not None] for s in seqs]
    want = full.decode_batch(valid, skip_special_tokens=False)
    cmd = [deepinfer, "detokenize", "--tokenizer", str(TOKENIZERS[name]), "--jsonl", "--added"]
    got = run_jsonl(cmd, [json.dumps(s) + "\n" for s in valid])
    bad = [i for i in range(len(valid)) if got[i] != want[i]]
    assert not bad, f"{len(bad)} differ; first ids {valid[bad[0]]}: ours {got[bad[0]]!r} hf {want[bad[0]]!r}"
    # without --added, added tokens are dropped: same as HF decoding the ids minus added ones
    added_ids = set(full.get_added_tokens_decoder())
    stripped = [[i for i in s if i not in added_ids] for s in valid]
    want2 = full.decode_batch(stripped, skip_special_tokens=False)
    got2 = run_jsonl(cmd[:-1], [json.dumps(s) + "\n" for s in valid])
    assert got2 == want2


def test_invalid_utf8_rejected(deepinfer):
    p = subprocess.run([deepinfer, "tokenize", "--json"], input=b"ok \xff\xfe", capture_output=True)
    assert p.returncode == 1
    assert b"not valid UTF-8" in p.stderr and b"offset 3" in p.stderr
    assert p.stdout == b""


def test_cli_shapes(deepinfer):
    p = subprocess.run([deepinfer, "tokenize", "--json"], input="Hello, world!".encode(), capture_output=True, check=True)
    assert json.loads(p.stdout) == Tokenizer.from_file(str(TOKENIZERS["v4"])).encode("Hello, world!").ids
    p = subprocess.run([deepinfer, "tokenize", "--template", "--json"], input="<｜User｜>hi".encode(),
                       capture_output=True, check=True)
    assert json.loads(p.stdout)[0] == 128803
    p = subprocess.run([deepinfer, "tokenize", "--json"], input="<｜User｜>hi".encode(), capture_output=True, check=True)
    assert 128803 not in json.loads(p.stdout)
    p = subprocess.run([deepinfer, "detokenize"], input=p.stdout, capture_output=True, check=True)
    assert p.stdout == "<｜User｜>hi".encode()
    p = subprocess.run([deepinfer, "tokenize", "--tokenizer", "/nonexistent.json"], input=b"x", capture_output=True)
    assert p.returncode == 1 and b"cannot open" in p.stderr
