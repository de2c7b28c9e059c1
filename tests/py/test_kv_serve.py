"""End to end: the prefix KV cache of `deepinfer serve` (docs/KV.md, src/kv/cache.h, src/kv/store.h).

Every test compares generated text token for token against a server started with
`--kv-cache off` (module fixture `ref`) and checks exact cache counters from
/metrics, the usage fields and the per-request log line.  The model is the
fixture e2e-v4vocab (real V4 vocabulary, 3 layers, window 16): the bounded
replay of 128 tokens covers its dependency cone (16 + 2*15 = 46), so replayed
hits must give the same greedy tokens as a full recompute too.

Expected numbers: a block is 128 tokens; a prompt of P tokens can hit at most
floor((P-1)/128) blocks.  A prefill keeps window states at the last block boundary
of each chunk and at every --kv-window-every-th one (default 4; model_backend.c cuts
the forward there), decoding at every boundary; so a repeat of a prompt hits
floor((P-1)/128)*128 tokens exactly, and a replay hit covers that minus the replay
length.  Disk-tier file counts are taken from the published_* counters.

Fault tests: truncation/bit flips of files under D/v1/<hh>/, the directory replaced
by a file, RLIMIT_FSIZE (EFBIG), and kill -9 with file writes slowed by an
LD_PRELOAD shim (compiled from SLOW_WRITE_C) so the kill lands inside a write.
"""
import concurrent.futures as cf
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import BIN
from serve_util import FIXTURES, Server

MODEL = "DeepSeek-V4-Pro"
BLOCK = 128
MAX_TOKENS = 48
BASE = ["--model", str(FIXTURES / "e2e-v4vocab"), "--model-name", MODEL, "--semantics", "transformers"]
LOG_RE = re.compile(r"^req (\d+) (\w+) status=(\d+) prompt=(\d+) cached=(\d+) cache=(\w+) ")
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima"]


# ------------------------------------------------------------------ helpers

def text(seed, n):
    """n sentences (~12.7 tokens each) that differ from the first word on for different seeds"""
    return " ".join(f"Rule {seed}.{i}: {WORDS[(seed * 7 + i) % 12]} {WORDS[(seed + i * 5) % 12]} is {i * 13 + seed}."
                    for i in range(n))


SYSTEM = text(1, 62)  # ~796 tokens with the template: 6 full blocks, the 7th partly


def body(system, user, **extra):
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return {"model": MODEL, "messages": msgs, "max_tokens": MAX_TOKENS, "temperature": 0,
            "thinking": {"type": "disabled"}, **extra}


def token_ids(bodies):
    """the prompt token ids the server computes for each request (deepinfer recipe tokens)"""
    clean = [{k: v for k, v in b.items() if k not in ("cache_salt", "cache_class")} for b in bodies]
    r = subprocess.run([str(BIN), "recipe", "tokens", "--api", "chat", "--jsonl"], capture_output=True, text=True,
                       input="".join(json.dumps(b) + "\n" for b in clean), timeout=60)
    assert r.returncode == 0, r.stderr
    return [json.loads(line)["ids"] for line in r.stdout.splitlines()]


def full_hit(p):
    """tokens a repeat of a prompt hits: every block before its last token (p: ids or their count)"""
    n = p if isinstance(p, int) else len(p)
    return (n - 1) // BLOCK * BLOCK


def lcp(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class KVServer(Server):
    """serve_util.Server plus an optional preexec_fn (resource limits) and a parsed request log"""

    def __init__(self, *args, preexec_fn=None, env=None):
        self.answered = 0  # generation requests answered 200: each one logs a line just after its response
        self._answered_lock = threading.Lock()
        super().__init__(*BASE, *args, env=env, preexec_fn=preexec_fn)

    def count_answer(self):
        with self._answered_lock:
            self.answered += 1

    def req_lines(self):
        return [m for m in (LOG_RE.match(line) for line in list(self.log)) if m]

    def kv(self):
        """deepinfer_kv_* as {short name: value}: 'block_hits_total{tier="disk"}' -> 'block_hits:disk'"""
        _, t = self.get("/metrics")
        out = {}
        for line in t.splitlines():
            if not line.startswith("deepinfer_kv_"):
                continue
            name, v = line.rsplit(" ", 1)
            name = name[len("deepinfer_kv_"):]
            m = re.match(r'(\w+?)(?:_total)?\{\w+="(\w+)"\}$', name)
            name = f"{m.group(1)}:{m.group(2)}" if m else re.sub(r"_total$", "", name)
            out[name] = float(v)
        return out

    def alive(self):
        return self.proc.poll() is None


def post(server, b, headers=None, timeout=60, path="/v1/chat/completions"):
    req = urllib.request.Request(server.url + path, data=json.dumps(b).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            st, j = r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    if st == 200 and hasattr(server, "count_answer"):
        server.count_answer()
    return st, j


def answer(j):
    """what greedy decoding produced: must not depend on the cache"""
    c = j["choices"][0]
    return (c["message"].get("content"), c["message"].get("reasoning_content"), c["finish_reason"],
            j["usage"]["completion_tokens"])


def cached(j):
    u = j["usage"]
    assert u["prompt_cache_hit_tokens"] == u["prompt_tokens_details"]["cached_tokens"], u
    assert u["prompt_cache_hit_tokens"] + u["prompt_cache_miss_tokens"] == u["prompt_tokens"], u
    return u["prompt_cache_hit_tokens"]


def chat(server, b, headers=None):
    """one request, alone on the server: (response json, its log line as (prompt, cached, path))"""
    # A log line is written just after its response: first let the lines of the requests answered before
    # this one (post() without chat()) come in, or one of them would be taken for this request's line.
    deadline = time.time() + 30  # polls: each ends as soon as its line is there
    while len(server.req_lines()) < server.answered and time.time() < deadline:
        time.sleep(0.01)
    n0 = len(server.req_lines())
    st, j = post(server, b, headers)
    assert st == 200, j
    deadline = time.time() + 30
    while len(server.req_lines()) <= n0 and time.time() < deadline:
        time.sleep(0.01)
    m = server.req_lines()[n0]
    assert m.group(2) == "chat" and m.group(3) == "200"
    line = (int(m.group(4)), int(m.group(5)), m.group(6))
    assert line[:2] == (j["usage"]["prompt_tokens"], cached(j)), (line, j["usage"])
    return j, line


def delta(after, before):
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def store_files(d, kind=None):
    """final files of the disk tier: {path: kind}"""
    out = {}
    root = os.path.join(d, "v1")
    if not os.path.isdir(root):
        return out
    for hh in os.listdir(root):
        if hh == "tmp":
            continue
        sub = os.path.join(root, hh)
        for f in os.listdir(sub) if os.path.isdir(sub) else []:
            m = re.fullmatch(r"[0-9a-f]{64}\.(\d+)", f)
            if m and (kind is None or int(m.group(1)) == kind):
                out[os.path.join(sub, f)] = int(m.group(1))
    return out


def tmp_files(d):
    t = os.path.join(d, "v1", "tmp")
    return os.listdir(t) if os.path.isdir(t) else []


def settle(server, d, n_files, timeout=15):
    """wait until the async writer has put at least n_files final files under d and is idle"""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if len(store_files(d)) >= n_files and not tmp_files(d) and server.kv()["disk_files"] >= n_files:
            return
        time.sleep(0.02)
    raise AssertionError(f"disk tier holds {len(store_files(d))} files, expected >= {n_files}: {server.kv()}")


def puts(server):
    """blocks and window states the server has published: one disk write each (fresh directory)"""
    k = server.kv()
    return int(k["published_blocks"] + k["published_window_states"])


def stop_ok(server):
    rc = server.stop()
    assert rc == 0, f"server exited {rc}:\n" + "".join(server.log[-20:])


@pytest.fixture(scope="module")
def ref(deepinfer):
    """a cache-off server: ref(body) -> its greedy answer (memoized)"""
    s = KVServer("--kv-cache", "off", "--threads", "2", "--quiet")
    memo = {}

    def response(b):
        k = json.dumps({k: v for k, v in b.items() if k not in ("cache_salt", "cache_class")}, sort_keys=True)
        if k not in memo:
            st, j = post(s, b)
            assert st == 200, j
            memo[k] = j
        return memo[k]

    def get(b):
        return answer(response(b))

    get.ptok = lambda b: response(b)["usage"]["prompt_tokens"]  # the request's prompt tokens
    yield get
    stop_ok(s)


SLOW_WRITE_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
/* LD_PRELOAD: a write() of more than 4 KiB to a regular file writes half of it, sleeps
 * $KVT_WRITE_SLEEP_US and returns short (legal; the store's write loop goes on), so every
 * disk-tier file (16-45 KB here) is being written for 3-4 sleeps: long enough for kill -9 or
 * another process's reader to land in the middle of one.  The first such write creates the
 * file $KVT_WRITE_MARK (if set): the shim works (an ASan build intercepts write() itself). */
ssize_t write(int fd, const void *buf, size_t n)
{
    static ssize_t (*real)(int, const void *, size_t);
    if (!real) real = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    struct stat st;
    if (n > 4096 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        static int marked;
        const char *m = getenv("KVT_WRITE_MARK");
        if (m && !marked) {
            marked = 1;
            close(open(m, O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
        }
        ssize_t k = real(fd, buf, n / 2);
        const char *e = getenv("KVT_WRITE_SLEEP_US");
        long us = e ? atol(e) : 2000;
        struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
        nanosleep(&ts, NULL);
        return k;
    }
    return real(fd, buf, n);
}
"""


@pytest.fixture(scope="module")
def slow_write(tmp_path_factory):
    """env for a server whose file writes are slow (an LD_PRELOAD shim); {} without a C compiler"""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return {}
    d = tmp_path_factory.mktemp("shim")
    (d / "slow_write.c").write_text(SLOW_WRITE_C)
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(d / "slow_write.so"), str(d / "slow_write.c"), "-ldl"],
                   check=True, capture_output=True)
    return {"LD_PRELOAD": str(d / "slow_write.so"), "KVT_WRITE_SLEEP_US": "2000"}


@pytest.fixture
def servers(deepinfer):
    """start(*args) -> a KVServer that is stopped (or killed) at teardown if the test did not"""
    started = []

    def start(*args, **kw):
        s = KVServer(*args, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        if s.alive():
            s.proc.kill()
            s.proc.wait()


# ------------------------------------------------------------------- tests

def test_repeat_and_shared_system_prompt(ref, servers):
    """1. the same long prompt twice hits every block before its last token, exactly; a prompt
    sharing only the system prompt hits the system prompt's blocks"""
    a = body(SYSTEM, "hello")
    b = body(SYSTEM, text(2, 30))  # same system prompt, a long different user message
    ia, ib = token_ids([a, b])
    common = lcp(ia, ib) // BLOCK
    # the fixture's shape: A > 3 blocks; B shares exactly the blocks up to A's window state
    assert full_hit(ia) >= 4 * BLOCK and common * BLOCK == full_hit(ia) and len(ib) > len(ia) + BLOCK
    s = servers("--threads", "2")
    k0 = s.kv()
    j1, l1 = chat(s, a)
    assert l1 == (len(ia), 0, "miss") and answer(j1) == ref(a)
    k1 = s.kv()
    j2, l2 = chat(s, a)
    assert l2 == (len(ia), full_hit(ia), "exact")
    assert answer(j2) == ref(a)
    d = delta(s.kv(), k1)
    assert d["lookups"] == 1 and d["lookups_by_path:exact"] == 1 and d.get("lookups_by_path:replay", 0) == 0
    assert d["block_hits:memory"] == full_hit(ia) // BLOCK and d["hit_tokens"] == full_hit(ia)
    assert d["window_hits:memory"] == 1 and d.get("replayed_tokens", 0) == 0
    assert delta(k1, k0)["published_blocks"] == full_hit(ia) // BLOCK
    # shared system prompt only
    j3, l3 = chat(s, b)
    assert l3 == (len(ib), common * BLOCK, "exact") and answer(j3) == ref(b)
    # and a third prompt that shares nothing: a miss
    c = body(text(3, 62), "hello")
    j4, l4 = chat(s, c)
    assert l4[1:] == (0, "miss") and answer(j4) == ref(c)
    # A long first turn keeps window states at every 4th block boundary of its prefill (default
    # --kv-window-every 4) and at its last one; a second conversation sharing its 6-block system
    # prompt finds 6 blocks and the window state at block 4: an exact hit of 512 tokens
    sys2 = text(7, 62)
    e1, e2 = body(sys2, text(5, 40)), body(sys2, text(6, 40))
    i1, i2 = token_ids([e1, e2])
    assert lcp(i1, i2) // BLOCK == 6 and len(i1) > 9 * BLOCK and len(i2) > 7 * BLOCK
    j5, l5 = chat(s, e1)
    assert l5[1:] == (0, "miss") and answer(j5) == ref(e1)
    k = s.kv()
    j6, l6 = chat(s, e2)
    assert l6 == (len(i2), 4 * BLOCK, "exact") and answer(j6) == ref(e2)
    dk = delta(s.kv(), k)
    # blocks are counted as hits only when attached: 4 of the 6 found
    assert dk["block_hits:memory"] == 4 and dk["window_hits:memory"] == 1 and dk["hit_tokens"] == 4 * BLOCK, dk
    stop_ok(s)


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_tiers(ref, servers, tmp_path, tier):
    """2. with no memory tier the blocks come back from the host tier; with no memory and no host
    tier, from the disk tier; the answers are those of a full recompute"""
    a = body(SYSTEM, "which tier?")
    ia = ref.ptok(a)
    nblk = full_hit(ia) // BLOCK
    d = str(tmp_path / "kv")
    args = ["--kv-mem-mb", "0"] + (["--kv-host-mb", "0", "--kv-dir", d] if tier == "disk" else [])
    s = servers("--threads", "2", *args)
    j1, l1 = chat(s, a)
    assert l1[2] == "miss" and answer(j1) == ref(a)
    if tier == "disk":
        nwin = int(s.kv()["published_window_states"])
        settle(s, d, nblk + nwin)
        assert len(store_files(d, 1)) == nblk and len(store_files(d, 2)) == nwin >= 1
    for _ in range(2):  # the second repeat: blocks went back to the memory tier and out again
        k = s.kv()
        j, line = chat(s, a)
        assert line == (ia, full_hit(ia), "exact") and answer(j) == ref(a)
        dk = delta(s.kv(), k)
        assert dk[f"block_hits:{tier}"] == nblk, dk
        assert dk.get("block_hits:memory", 0) == 0 and dk.get("block_hits:host" if tier == "disk" else
                                                             "block_hits:disk", 0) == 0, dk
    kv = s.kv()
    assert kv["disk_write_errors"] == 0 and kv["disk_damaged"] == 0
    stop_ok(s)


@pytest.mark.parametrize("compress", [0, 19])
def test_restart_reads_blocks_and_window_state_from_disk(ref, servers, tmp_path, compress):
    """3. a server stopped with SIGTERM right after answering has written everything (the store
    drains at exit: with zstd level 19 and --kv-window-every 1 the writer is still busy then); a new
    server on the same directory (without --kv-compress) hits blocks and window state from disk"""
    d = str(tmp_path / "kv")
    a = body(SYSTEM, "restart me " + (text(60, 100) if compress else ""))
    ia = ref.ptok(a)
    # with compression, also a window state at every block boundary: the writer lags the prefill
    s1 = servers("--threads", "2", "--kv-dir", d, "--kv-compress", str(compress),
                 *(["--kv-window-every", "1"] if compress else []))
    j1, l1 = chat(s1, dict(a, max_tokens=1))  # answered right after the prefill: writes still queued
    assert l1[2] == "miss" and answer(j1) == ref(dict(a, max_tokens=1))
    nwin = int(s1.kv()["published_window_states"])
    stop_ok(s1)  # no waiting for the writer: exit must drain its queue
    assert not tmp_files(d)
    assert len(store_files(d, 1)) == full_hit(ia) // BLOCK and len(store_files(d, 2)) == nwin >= 1
    flags = []
    for f in store_files(d):
        with open(f, "rb") as fh:
            flags.append(fh.read(14)[13])
    assert (1 in flags) == (compress > 0) and set(flags) <= {0, 1}, flags  # bit 0: a zstd payload
    s2 = servers("--threads", "2", "--kv-dir", d)
    k = s2.kv()
    assert k["disk_files"] == full_hit(ia) // BLOCK + nwin  # the open sweep counted them
    j2, l2 = chat(s2, a)
    assert l2 == (ia, full_hit(ia), "exact") and answer(j2) == ref(a)
    dk = delta(s2.kv(), k)
    assert dk["block_hits:disk"] == full_hit(ia) // BLOCK and dk["window_hits:disk"] == 1, dk
    assert dk.get("window_hits:memory", 0) == 0 and dk.get("block_hits:memory", 0) == 0
    assert s2.kv()["disk_damaged"] == 0
    stop_ok(s2)


@pytest.mark.parametrize("replay", [None, "16", "0"])
def test_window_state_expired(ref, servers, replay):
    """4. after the window state's TTL: bounded replay (default 128 tokens: the cone is covered, so
    the answer is exact), an approximate replay (--kv-replay 16: only the path is checked, and such a
    sequence publishes nothing), or with --kv-replay 0 no hit at all"""
    a = body(SYSTEM, f"expire {replay}")
    ia = ref.ptok(a)
    # TTL 2 s: the third request below must find the window state the second one republished while it is
    # still alive (~0.2 s later on an idle machine), so the TTL is what leaves room for a loaded one
    s = servers("--threads", "2", "--kv-swa-ttl", "2", *(["--kv-replay", replay] if replay else []),
                *(["--kv-replay-publish", "off"] if replay == "16" else []))
    j1, l1 = chat(s, a)
    assert l1[2] == "miss" and answer(j1) == ref(a)
    time.sleep(2.2)  # published before chat returned: expired after 2 s, whatever the sleep overruns
    k = s.kv()
    j2, (p, c, path) = chat(s, a)
    dk = delta(s.kv(), k)
    if replay == "0":
        assert path != "replay" and (c, path) == (0, "miss"), (c, path)
        assert dk.get("replayed_tokens", 0) == 0 and dk["lookups_by_path:miss"] == 1
        assert answer(j2) == ref(a)
        stop_ok(s)
        return
    n = int(replay or 128)
    assert (p, c, path) == (ia, full_hit(ia) - n, "replay")
    assert dk["replayed_tokens"] == n and dk["lookups_by_path:replay"] == 1 and dk["hit_tokens"] == c
    assert dk["block_hits:memory"] == full_hit(ia) // BLOCK and dk.get("window_hits:memory", 0) == 0
    if replay == "16":
        # 16 < 46: approximate, so with --kv-replay-publish off the sequence publishes nothing
        assert dk.get("published_blocks", 0) == 0 and dk.get("published_window_states", 0) == 0, dk
        stop_ok(s)
        return
    assert answer(j2) == ref(a)  # 128 >= 16 + 2*15: the replay is exact on this model
    # The replayed sequence is exact and passes the hit point's block boundary again, so it should
    # publish the window state there (cache.h: "publishes ... the window state at each block boundary
    # it reaches"); then the next request is an exact hit instead of another replay.
    j3, l3 = chat(s, a)
    assert answer(j3) == ref(a)
    assert l3 == (ia, full_hit(ia), "exact"), (
        f"BUG (cache.c kv_cache_attach): the third request took {l3}; the replayed (exact) sequence passed "
        "the hit point's block boundary again but did not republish its window state there (attach sets "
        "t->last_bnd to the hit point), so every later request on this prefix replays again; metrics delta "
        f"of the replayed request: {dk}")
    stop_ok(s)


def test_two_servers_share_a_directory(ref, servers, tmp_path, slow_write):
    """5. A writes, B (running at the same time, same directory) hits A's blocks and window state;
    then both serve many prompts with a common prefix concurrently, reading and writing the same
    files: no damaged file, no write error, every answer equal to a full recompute"""
    d = str(tmp_path / "kv")
    # no memory/host tier: every hit is read from the shared directory
    tiers = ["--threads", "1", "--kv-dir", d, "--kv-mem-mb", "0", "--kv-host-mb", "0"]
    A, B = servers(*tiers, env=slow_write), servers(*tiers, env=slow_write)  # each file takes ~5 ms to write
    x = body(SYSTEM, "shared dir")
    ix = ref.ptok(x)
    ja, la = chat(A, x)
    assert la[2] == "miss" and answer(ja) == ref(x)
    settle(A, d, puts(A))
    k = B.kv()
    jb, lb = chat(B, x)
    assert lb == (ix, full_hit(ix), "exact") and answer(jb) == ref(x)
    dk = delta(B.kv(), k)
    assert dk["block_hits:disk"] == full_hit(ix) // BLOCK and dk["window_hits:disk"] == 1, dk

    prefix = text(4, 30)  # ~3 blocks in common
    prompts = [body(prefix, text(100 + i, 5 + 3 * i)) for i in range(10)]
    want = [ref(p) for p in prompts]
    jobs = [(srv, i) for rnd in range(2) for i in range(len(prompts)) for srv in (A, B)]
    random.Random(5).shuffle(jobs)
    with cf.ThreadPoolExecutor(8) as ex:
        res = list(ex.map(lambda job: (job, post(job[0], prompts[job[1]])), jobs))
    hits = 0
    for (srv, i), (st, j) in res:
        assert st == 200, j
        assert answer(j) == want[i], i
        hits += cached(j) > 0
    assert hits > 0
    for srv in (A, B):
        kv = srv.kv()
        assert kv["disk_damaged"] == 0 and kv["disk_write_errors"] == 0 and kv["disk_dropped"] == 0, kv
        assert kv["block_hits:disk"] > 0
    stop_ok(A)
    stop_ok(B)


# ------------------------------------------------------------------ faults

def _flip(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        v = f.read(1)[0]
        f.seek(off)
        f.write(bytes([v ^ 0x10]))


def test_fault_damaged_files(ref, servers, tmp_path):
    """6a. truncated, bit-flipped and foreign files are misses (counted, removed), never wrong tokens"""
    d = str(tmp_path / "kv")
    # 3 full blocks each and no boundary reached while decoding: one window state per prompt
    ps = [body(text(10 + i, 33), "damage") for i in range(3)]
    ids = [ref.ptok(p) for p in ps]
    assert all(full_hit(i) == 3 * BLOCK and i + MAX_TOKENS < 4 * BLOCK for i in ids), ids
    s = servers("--threads", "2", "--kv-dir", d)
    files = []
    for p in ps:
        before = set(store_files(d))
        chat(s, p)
        settle(s, d, puts(s))
        files.append({f: k for f, k in store_files(d).items() if f not in before})
    stop_ok(s)
    blocks = [sorted(f for f, k in fs.items() if k == 1) for fs in files]
    swa = [[f for f, k in fs.items() if k == 2] for fs in files]
    assert [len(b) for b in blocks] == [3, 3, 3] and [len(w) for w in swa] == [1, 1, 1], files
    # prompt 0: every block damaged in a way the open sweep sees (size or header)
    os.truncate(blocks[0][0], 0)
    os.truncate(blocks[0][1], os.path.getsize(blocks[0][1]) - 1)
    _flip(blocks[0][2], 20)  # inside the key field
    # prompt 1: one payload bit flipped in every block -> the header is fine, the CRC is not
    for f in blocks[1]:
        _flip(f, 80 + os.path.getsize(f) // 2)
    # prompt 2: the blocks are intact, the window state has a flipped bit -> replay
    _flip(swa[2][0], os.path.getsize(swa[2][0]) - 100)
    # and a foreign file with one of our names
    junk = os.path.join(d, "v1", "ab", "ab" + "0" * 62 + ".1")
    os.makedirs(os.path.dirname(junk), exist_ok=True)
    with open(junk, "wb") as f:
        f.write(os.urandom(300))

    s2 = servers("--threads", "2", "--kv-dir", d)
    assert s2.kv()["disk_damaged"] == 4  # prompt 0's three blocks and the junk, at open
    assert not any(os.path.exists(f) for f in blocks[0]) and not os.path.exists(junk)
    j0, l0 = chat(s2, ps[0])
    assert l0[1:] == (0, "miss") and answer(j0) == ref(ps[0])
    j1, l1 = chat(s2, ps[1])
    assert l1[1:] == (0, "miss") and answer(j1) == ref(ps[1])
    assert s2.kv()["disk_damaged"] == 5  # + block 0 of prompt 1: the chain stops there
    k = s2.kv()
    j2, l2 = chat(s2, ps[2])
    assert l2[1:] == (full_hit(ids[2]) - 128, "replay") and answer(j2) == ref(ps[2])
    dk = delta(s2.kv(), k)
    assert s2.kv()["disk_damaged"] == 6 and dk["block_hits:disk"] == 3 and dk.get("window_hits:disk", 0) == 0, dk
    # everything is served again correctly, from what the misses republished (prompt 2's window
    # state is not republished after its replay: test_window_state_expired[None] covers that)
    for p, path in zip(ps, ["exact", "exact", None]):
        j, line = chat(s2, p)
        assert line[2] == (path or line[2]) and line[1] > 0 and answer(j) == ref(p)
    assert s2.kv()["disk_damaged"] == 6
    assert s2.alive()
    stop_ok(s2)


def test_fault_directory_replaced_by_a_file(ref, servers, tmp_path):
    """6b. the --kv-dir vanishes under a running server (a regular file takes its place): reads
    miss, writes fail and are counted, the answers stay right, and nothing is created at D"""
    d = str(tmp_path / "kv")
    s = servers("--threads", "2", "--kv-dir", d, "--kv-mem-mb", "0", "--kv-host-mb", "0")
    x, y = body(SYSTEM, "before"), body(text(20, 62), "after")
    ix, iy = ref.ptok(x), ref.ptok(y)
    chat(s, x)
    settle(s, d, puts(s))
    j, line = chat(s, x)
    assert line[1:] == (full_hit(ix), "exact") and s.kv()["block_hits:disk"] == full_hit(ix) // BLOCK
    os.rename(d, d + ".away")
    with open(d, "w") as f:
        f.write("not a directory\n")
    k, p0 = s.kv(), puts(s)
    j, line = chat(s, x)  # the blocks are gone with the directory: a miss, recomputed
    assert line[1:] == (0, "miss") and answer(j) == ref(x)
    j, line = chat(s, y)
    assert line[1:] == (0, "miss") and answer(j) == ref(y)
    # x republished its blocks and window states, y published its own: every write fails
    want = puts(s) - p0
    assert want >= full_hit(ix) // BLOCK + full_hit(iy) // BLOCK + 2
    deadline = time.time() + 10
    while s.kv()["disk_write_errors"] - k["disk_write_errors"] < want and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    dk = delta(s.kv(), k)
    assert dk.get("disk_write_errors", 0) == want, dk
    assert dk.get("disk_damaged", 0) == 0
    j, line = chat(s, y)
    assert answer(j) == ref(y)
    assert os.path.isfile(d) and open(d).read() == "not a directory\n"
    assert s.alive()
    stop_ok(s)


@pytest.mark.parametrize("sigxfsz", ["default", "ignored"])
def test_fault_disk_full(ref, servers, tmp_path, sigxfsz):
    """6c. writes that hit RLIMIT_FSIZE (EFBIG, like a full disk) are write errors: the server keeps
    answering correctly, and no short file is ever renamed into place.  'default': the server is
    started with SIGXFSZ at its default action (kills the process), as a real service would be;
    'ignored': the parent ignores SIGXFSZ (inherited through exec), which tests EFBIG handling alone."""

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL if sigxfsz == "default" else signal.SIG_IGN)

    d = str(tmp_path / "kv")
    s = servers("--threads", "2", "--kv-dir", d, preexec_fn=limit)
    ps = [body(SYSTEM, "full disk"), body(text(30, 40), "full disk")]
    ids = [ref.ptok(p) for p in ps]
    for p in ps:
        try:
            st, j = post(s, p)
        except (urllib.error.URLError, ConnectionError, OSError) as e:
            st, j = None, repr(e)
        time.sleep(0.3)  # let the writer try
        if not s.alive() or st is None:
            try:
                rc = s.proc.wait(5)
            except subprocess.TimeoutExpired:
                rc = None
            pytest.fail(f"BUG (store.c): the server died (exit {rc}; -{int(signal.SIGXFSZ)} = SIGXFSZ) while "
                        f"writing a block past RLIMIT_FSIZE, request -> {j!r}: the store must ignore SIGXFSZ "
                        "and count EFBIG as a write error\n" + "".join(s.log[-5:]))
        assert st == 200 and answer(j) == ref(p)
    want = puts(s)  # every block and window state is > 4096 bytes: every write fails
    assert want >= sum(full_hit(i) // BLOCK + 1 for i in ids)
    deadline = time.time() + 10
    while s.kv()["disk_write_errors"] < want and time.time() < deadline:
        time.sleep(0.02)
    kv = s.kv()
    assert kv["disk_write_errors"] == want, ("EFBIG writes must count as write errors", kv)
    bad = [f for f in store_files(d) if os.path.getsize(f) <= 4096]
    assert not bad, f"{len(bad)} truncated files were renamed into place: {bad[:3]}"
    assert not store_files(d) and kv["disk_files"] == 0
    # the same prompts again: no damage read back, same answers
    for p in ps:
        j, line = chat(s, p)
        assert line[2] == "exact" and answer(j) == ref(p)  # from the memory tier
    assert s.kv()["disk_damaged"] == 0
    stop_ok(s)


def _mid_write(d):
    """a file of the disk tier is being written: a temp file, or a final file shorter than its
    header says (only a writer that does not write-then-rename shows those)"""
    if tmp_files(d):
        return True
    for f in store_files(d):
        try:
            with open(f, "rb") as fh:
                h = fh.read(80)
            size = os.path.getsize(f)
        except OSError:
            continue
        if len(h) < 80 or size != 84 + int.from_bytes(h[72:80], "little"):
            return True
    return False


def test_fault_kill_9_while_writing(ref, servers, tmp_path, slow_write):
    """6d. kill -9 while blocks are being written (file writes slowed by an LD_PRELOAD shim, the
    kill sent as soon as a write is seen in progress), in three rounds with their own prompts: one
    killed mid-request, two right after the first answer: the next server on the directory finds no
    damaged final file (temp files may be left), and answers correctly"""
    d = str(tmp_path / "kv")
    rounds = [[body(text(40 + 5 * r + i, 35 + 9 * i), f"kill {r}.{i}") for i in range(4)] for r in range(3)]
    caught = 0
    for r, ps in enumerate(rounds):
        want = [ref(p) for p in ps]
        # slow file writes (10 ms sleeps: ~60 ms of writing per block against ~25 ms of prefill, so
        # the queue is long) and a window state at every boundary
        s = servers("--threads", "1", "--kv-dir", d, "--kv-window-every", "1",
                    env=dict(slow_write, KVT_WRITE_SLEEP_US="10000", KVT_WRITE_MARK=str(tmp_path / "shim-on")))
        first = threading.Event()

        def go(p, srv=s):
            try:
                res = post(srv, p, timeout=60)
            except Exception as e:  # the kill cuts the others off
                res = (None, repr(e))
            first.set()
            return res

        with cf.ThreadPoolExecutor(len(ps)) as ex:
            futs = [ex.submit(go, p) for p in ps]
            if r:  # round 0: mid-request; rounds 1 and 2: after the first answer
                first.wait(60)
            deadline = time.time() + (5 if r else 60)
            while time.time() < deadline and not _mid_write(d):
                time.sleep(0.0005)
            caught += time.time() < deadline
            s.proc.send_signal(signal.SIGKILL)
            s.proc.wait()
            done = [f.result() for f in futs]
        assert any(st == 200 for st, _ in done) == (r > 0)
        for (st, j), w in zip(done, want):
            if st == 200:
                assert answer(j) == w
    left = tmp_files(d)
    s2 = servers("--threads", "2", "--kv-dir", d)
    assert s2.kv()["disk_damaged"] == 0, "the open sweep found damaged final files: a write was not atomic"
    if (tmp_path / "shim-on").exists():  # else writes are too quick to be caught (no compiler, ASan)
        assert caught, "no kill landed in the middle of a file write: the test did not test anything"
    everything = [p for ps in rounds for p in ps]
    for p in everything:
        j, _ = chat(s2, p)
        assert answer(j) == ref(p)
    for p in everything:  # now every prompt is cached
        j, line = chat(s2, p)
        assert line[1] == full_hit(ref.ptok(p)) and line[2] == "exact" and answer(j) == ref(p)
    kv = s2.kv()
    assert kv["disk_damaged"] == 0 and kv["disk_write_errors"] == 0, (kv, f"{len(left)} temp files were left")
    stop_ok(s2)


# ------------------------------------------------------------ namespaces

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def test_cache_salt_and_class(ref, servers, tmp_path):
    """7. cache_salt separates namespaces; invalid salt or class values are 400s in the API's error
    shape; cache_class (body, over the header) and X-Cache-Class (header) pick the TTL written into
    disk files (default: agent with tools, else chat)"""
    d = str(tmp_path / "kv")
    s = servers("--threads", "2", "--kv-dir", d)
    x = body(SYSTEM, "salted")
    ix = ref.ptok(x)
    hit = full_hit(ix)
    for salt, want in [("tenant-a", 0), ("tenant-b", 0), ("tenant-a", hit), (None, 0), ("tenant-b", hit),
                       (None, hit), ("tenant-A", 0)]:
        b = dict(x, cache_salt=salt) if salt else x
        j, line = chat(s, b)
        assert line[1] == want, (salt, line)
        assert answer(j) == ref(x)
    assert post(s, dict(x, cache_salt=None))[0] == 200  # null = no salt

    def bad(b, headers=None, what="cache_", path="/v1/chat/completions"):
        st, j = post(s, b, headers, path=path)
        assert st == 400, (b.get("cache_salt"), b.get("cache_class"), headers, j)
        # the server's error shape (every API): {"error": {"message", "type", "param", "code"}}
        assert set(j) == {"error"} and set(j["error"]) == {"message", "type", "param", "code"}, j
        assert j["error"]["type"] == "invalid_request_error", j
        assert what in j["error"]["message"], j

    bad(dict(x, cache_salt=12345), what="cache_salt")
    bad(dict(x, cache_salt=["a"]), what="cache_salt")
    bad(dict(x, cache_salt="s" * 257), what="cache_salt")
    assert post(s, dict(x, cache_salt="s" * 256))[0] == 200
    bad(dict(x, cache_class="batch"), what="cache_class")
    bad(dict(x, cache_class=1), what="cache_class")
    bad(dict(x, cache_class="Agent"), what="cache_class")
    bad(x, {"X-Cache-Class": "bulk"}, what="cache_class")
    # the other APIs check the same fields
    msg = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    bad(dict(msg, cache_salt=7), what="cache_salt", path="/v1/messages")
    bad(msg, {"X-Cache-Class": "nope"}, what="cache_class", path="/v1/messages")
    bad({"model": MODEL, "input": "hi", "cache_salt": 7}, what="cache_salt", path="/v1/responses")
    bad({"model": MODEL, "input": "hi", "cache_class": "x"}, what="cache_class", path="/v1/responses")
    assert post(s, dict(msg, cache_salt="t", cache_class="agent"), path="/v1/messages")[0] == 200

    # the class decides the TTL in the disk files of the blocks a request publishes
    ttl = {"agent": 72 * 3600, "chat": 168 * 3600}
    cases = [({"cache_class": "agent"}, None, "agent"), ({"cache_class": "chat"}, None, "chat"),
             ({}, {"X-Cache-Class": "agent"}, "agent"), ({}, {"X-Cache-Class": "chat"}, "chat"),
             ({}, None, "chat"), ({"cache_class": "chat"}, {"X-Cache-Class": "agent"}, "chat"),
             ({"tools": TOOLS}, None, "agent"), ({"tools": TOOLS, "cache_class": "chat"}, None, "chat")]
    settle(s, d, 1)
    for n, (extra, headers, cls) in enumerate(cases):
        p = body(text(50 + n, 25), "class", **extra)
        before = set(store_files(d, 1))
        j, line = chat(s, p, headers)
        assert line[2] == "miss" and answer(j) == ref(p)
        ip = ref.ptok(p)
        deadline = time.time() + 10
        while len(set(store_files(d, 1)) - before) < full_hit(ip) // BLOCK and time.time() < deadline:
            time.sleep(0.02)
        new = set(store_files(d, 1)) - before
        assert len(new) == full_hit(ip) // BLOCK
        for f in new:
            with open(f, "rb") as fh:
                h = fh.read(80)
            assert int.from_bytes(h[48:52], "little") == ttl[cls], (extra, headers, f)
    assert s.kv()["disk_damaged"] == 0
    stop_ok(s)


def test_usage_in_every_api(servers):
    """Responses and Messages report the cache in their own usage shapes, and the three APIs share
    blocks: the same system prompt renders to the same prefix ids whatever the API."""
    s = servers("--threads", "2")
    sysm = SYSTEM
    rb = {"model": MODEL, "instructions": sysm, "input": "hi", "max_output_tokens": 4}
    mb = {"model": MODEL, "system": sysm, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    st, r1 = post(s, rb, path="/v1/responses")
    assert st == 200 and r1["usage"]["input_tokens_details"]["cached_tokens"] == 0, r1["usage"]
    p = r1["usage"]["input_tokens"]
    st, r2 = post(s, rb, path="/v1/responses")
    assert st == 200 and r2["usage"]["input_tokens_details"]["cached_tokens"] == full_hit(p), r2["usage"]
    # Messages after Responses: the system prompt's blocks are already there; Anthropic's input_tokens
    # excludes cache reads
    st, m1 = post(s, mb, path="/v1/messages")
    u = m1["usage"]
    assert st == 200 and u["cache_read_input_tokens"] > 0 and u["cache_read_input_tokens"] % 128 == 0, u
    st, m2 = post(s, mb, path="/v1/messages")
    u2 = m2["usage"]
    total = u2["input_tokens"] + u2["cache_read_input_tokens"]
    assert st == 200 and u2["cache_read_input_tokens"] == full_hit(total), u2
    stop_ok(s)
