#!/usr/bin/env python3
"""Reference timing of transformers' eager DeepSeek-V4 forward, per decoder layer.

What is measured
  A "V4-Flash slice" (MODEL_DIR/config.json: the real V4-Flash dimensions with
  num_hidden_layers = N, layer kinds from `compress_ratios`: 0 = SWA, 4 = CSA,
  128 = HCA) is built as `DeepseekV4ForCausalLM` in bf16 with random weights
  (the FP8/FP4 `quantization_config` / `expert_dtype` are dropped and no
  safetensors are read), attn_implementation="eager", directly on the device.
  For each case the time of every decoder layer (forward pre/post hooks on
  model.model.layers[i], CUDA events) and of the whole forward (embedding,
  mask, layers, hc_head, norm, lm_head on the last token) is taken; the median
  over the repetitions after warm-up is reported, averaged per layer kind.

  * prefill: one forward over T tokens at batch 1, no cache (use_cache=False).
    If that runs out of memory, the same T is also timed as a chunked prefill
    through the cache (recorded with "chunk").
  * decode: ONE step (1 new token per sequence) at batch B on top of a cache
    holding P tokens per sequence.

How the decode cache is built ("synthetic", the default)
  transformers 5.17 keeps V4 state in a DynamicCache whose layers are
  DynamicSlidingWindowLayer (SWA), DeepseekV4CSACache and DeepseekV4HCACache:
  a 127-token K=V window, the compressed entries emitted so far
  (`compressed_kv`, CSA also for its indexer), the not-yet-compressed tail
  (`buffer_kv` / `buffer_gate`), entry counters and, for CSA, the overlap
  (half-A) slices of the last full block. A short real chunked prefill at
  batch 1 gives the template of that layout; the cache for (B, P) is the
  template with every tensor replaced by a random one of the shape a real
  P-token prefill would leave (window min(P, W-1), P // ratio entries,
  P % ratio buffered tokens) and the counters set to P. At start-up this
  layout is checked against a real chunked prefill. Content does not change
  the work of a step (the indexer computes all P/4 scores and a top-k either
  way). The cache is restored to its P-token state before every repetition,
  so each timed step is the step at position P. `--cache real` builds it
  instead by a real chunked prefill of P tokens at batch 1, repeated to B.

Usage
  python3 bench/gpu_layers_hf.py MODEL_DIR --out results.json [--device cuda]
          [--cases prefill:4096 decode:8x32768 ...] [--time-cap-s 60]
          [--budget-s 330] [--tiny-selftest]
"""

import argparse
import copy
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback

T_START = time.time()

KIND_OF_LAYER_TYPE = {
    "sliding_attention": "SWA",
    "compressed_sparse_attention": "CSA",
    "heavily_compressed_attention": "HCA",
}
KIND_ORDER = ("SWA", "CSA", "HCA")
DROPPED_CONFIG_KEYS = ("quantization_config", "expert_dtype", "torch_dtype", "dtype")
DEFAULT_CASES = ["prefill:4096", "prefill:16384"] + [
    f"decode:{b}x{p}" for b in (1, 8, 64, 256) for p in (4096, 32768, 131072)
]
TEMPLATE_TOKENS = 512  # real prefill that provides the cache layout template
TEMPLATE_CHUNK = 256
CHECK_TOKENS = 1024  # real prefill the synthetic layout is checked against
CHECK_CHUNK = 512

torch = None  # imported in main() so that --help works without torch


def log(msg):
    print(f"[{time.time() - T_START:7.1f}s] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- config


def load_slice_config(model_dir):
    """Read MODEL_DIR/config.json, drop the quantization keys, return (config, dropped)."""
    from transformers import DeepseekV4Config

    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        sys.exit(f"error: {path} not found (MODEL_DIR must hold the slice's config.json)")
    with open(path) as f:
        raw = json.load(f)
    dropped = [k for k in DROPPED_CONFIG_KEYS if k in raw]
    for k in dropped:
        raw.pop(k)
    if "compress_ratios" not in raw and "layer_types" not in raw:
        # DeepseekV4Config would fall back to the V4-Pro schedule; refuse instead.
        sys.exit("error: config.json has neither compress_ratios nor layer_types")
    cfg = DeepseekV4Config.from_dict(raw)
    return cfg, dropped


def tiny_config_dict():
    """Tiny V4 config for the CPU self-test (keeps the quantization keys to test dropping)."""
    return {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "vocab_size": 512, "hidden_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 128,
        "qk_rope_head_dim": 64, "q_lora_rank": 64, "o_groups": 2, "o_lora_rank": 32,
        "moe_intermediate_size": 64, "n_routed_experts": 8, "n_shared_experts": 1,
        "num_experts_per_tok": 2, "num_hash_layers": 3, "scoring_func": "sqrtsoftplus",
        "norm_topk_prob": True, "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
        "compress_ratios": [0, 0, 4, 128], "sliding_window": 128,
        "index_n_heads": 4, "index_head_dim": 128, "index_topk": 16,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
        "rope_theta": 10000, "compress_rope_theta": 160000,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "max_position_embeddings": 1048576, "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
        "expert_dtype": "fp4", "torch_dtype": "bfloat16",
    }


def config_summary(cfg, dropped):
    keys = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "qk_rope_head_dim", "q_lora_rank", "o_groups", "o_lora_rank", "n_routed_experts",
            "moe_intermediate_size", "num_experts_per_tok", "n_shared_experts", "sliding_window",
            "index_n_heads", "index_head_dim", "index_topk", "vocab_size", "num_hidden_layers",
            "hc_mult", "layer_types", "mlp_layer_types", "compress_rates", "rope_parameters")
    out = {k: getattr(cfg, k, None) for k in keys}
    out["dropped_keys"] = dropped
    return out


# ----------------------------------------------------------------------------- model


def build_model(cfg, device, experts_impl, seed):
    """Construct DeepseekV4ForCausalLM in bf16 on `device` with HF init disabled, then fill."""
    from transformers import DeepseekV4ForCausalLM
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older layouts: fall back to HF's own (slower) init
        import contextlib
        no_init_weights = contextlib.nullcontext
    torch.manual_seed(seed)
    with torch.device(device), no_init_weights():
        model = DeepseekV4ForCausalLM._from_config(
            cfg, dtype=torch.bfloat16, attn_implementation="eager",
            experts_implementation=experts_impl)
    model.eval().requires_grad_(False)
    fill_random_(model, cfg)
    return model


def fill_random_(model, cfg):
    """Fast random weights: N(0, 1/fan_in) for matrices, ones for norms, valid tid2eid."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if p.dim() >= 2:
                std = 1.0 if "embed_tokens" in name else p.shape[-1] ** -0.5
                p.normal_(0.0, std)
            elif "norm" in name:
                p.fill_(1.0)
            elif leaf in ("scale", "hc_scale"):
                p.fill_(1.0)
            elif leaf == "sinks":
                p.normal_(0.0, 1.0)
            else:  # HC base, other vectors
                p.normal_(0.0, 0.1)
        for name, b in model.named_buffers():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "tid2eid":
                # each token routes to num_experts_per_tok distinct random experts
                n_exp = cfg.n_routed_experts
                picks = torch.rand(b.shape[0], n_exp, device=b.device).topk(b.shape[1], dim=1).indices
                b.copy_(picks.to(b.dtype))
            elif leaf == "e_score_correction_bias":
                b.normal_(0.0, 0.01)


def model_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


# ----------------------------------------------------------------------------- timing


class LayerTimer:
    """Per-decoder-layer spans via forward pre/post hooks (CUDA events, or perf_counter on CPU)."""

    def __init__(self, layers, device):
        self.cuda = device.type == "cuda"
        self.n = len(layers)
        self.marks = None
        self.handles = []
        for i, layer in enumerate(layers):
            self.handles.append(layer.register_forward_pre_hook(self._pre(i)))
            self.handles.append(layer.register_forward_hook(self._post(i)))

    def _stamp(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def _span_ms(self, a, b):
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def _pre(self, i):
        def hook(module, args):
            if self.marks is not None:
                self.marks[i].append([self._stamp(), None])
        return hook

    def _post(self, i):
        def hook(module, args, output):
            if self.marks is not None and self.marks[i]:
                self.marks[i][-1][1] = self._stamp()
        return hook

    def measure(self, step):
        """Run step() once; return (forward_ms, [ms per layer summed over calls])."""
        self.marks = [[] for _ in range(self.n)]
        try:
            if self.cuda:
                torch.cuda.synchronize()
            t0 = self._stamp()
            step()
            t1 = self._stamp()
            if self.cuda:
                torch.cuda.synchronize()
            layer_ms = [sum(self._span_ms(a, b) for a, b in calls) for calls in self.marks]
            return self._span_ms(t0, t1), layer_ms
        finally:
            self.marks = None

    def remove(self):
        for h in self.handles:
            h.remove()


# ----------------------------------------------------------------------------- cache


def real_prefill_cache(model, tokens, chunk, batch=1):
    """Prefill `tokens` random tokens through a DynamicCache in chunks; return the cache."""
    from transformers import DynamicCache
    dev = model.device
    cache = DynamicCache(config=model.config)
    ids = torch.randint(0, model.config.vocab_size, (batch, tokens), device=dev)
    for s in range(0, tokens, chunk):
        model(input_ids=ids[:, s:s + chunk], past_key_values=cache, use_cache=True, logits_to_keep=1)
    return cache


def derive_cache(model, template, batch, context, fill):
    """New DynamicCache with the template's layout, sized for (batch, context).

    fill="random": every tensor is a new random tensor of the size a real `context`-token
    prefill leaves; fill="repeat": the template must already hold `context` tokens and its
    tensors are repeated along the batch dimension.
    """
    from transformers import DynamicCache
    window = model.config.sliding_window - 1
    cache = DynamicCache(config=model.config)

    def make(x, seq_len):
        if x is None:
            return None
        if fill == "repeat":
            return x.repeat(batch, *([1] * (x.dim() - 1)))
        shape = (batch,) + tuple(x.shape[1:])
        if seq_len is not None:
            shape = shape[:-2] + (seq_len,) + shape[-1:]
        return torch.randn(shape, dtype=x.dtype, device=x.device)

    for i, tmpl in enumerate(template.layers):
        ratio = getattr(tmpl, "compress_rate", None)
        shared_kv = tmpl.values is tmpl.keys
        state = {}
        for key, val in vars(tmpl).items():
            if key in ("keys", "values"):
                state[key] = make(val, min(context, window))
            elif key == "cumulative_length":
                state[key] = context
            elif key in ("buffer_kv", "buffer_gate"):
                state[key] = {n: make(v, context % ratio) for n, v in val.items()}
            elif key == "compressed_kv":
                state[key] = {n: make(v, context // ratio) for n, v in val.items()}
            elif key == "entry_count":
                state[key] = {n: context // ratio for n in val}
            elif key in ("overlap_kv", "overlap_gate"):
                state[key] = {n: make(v, None) for n, v in val.items()}
            elif torch.is_tensor(val) and val.dim() > 0:
                raise RuntimeError(f"unknown cache tensor {type(tmpl).__name__}.{key}: "
                                   "this transformers version keeps other V4 cache state")
            elif isinstance(val, dict):
                raise RuntimeError(f"unknown cache dict {type(tmpl).__name__}.{key}")
            else:
                state[key] = val
        if shared_kv:
            state["values"] = state["keys"]
        layer = copy.copy(tmpl)
        layer.__dict__.update(state)
        cache.layers[i] = layer
    return cache


def cache_signature(cache):
    """Layout of a cache: layer classes, tensor shapes/dtypes, counters (for comparison)."""
    def sig(v):
        if torch.is_tensor(v):
            return [list(v.shape), str(v.dtype)] if v.dim() else "scalar-tensor"
        if isinstance(v, dict):
            return {k: sig(x) for k, x in v.items()}
        if isinstance(v, (int, float, str, bool)) or v is None:
            return v
        return type(v).__name__
    out = []
    for layer in cache.layers:
        d = {k: sig(v) for k, v in vars(layer).items() if k != "device"}
        d["class"] = type(layer).__name__
        d["values_is_keys"] = layer.values is layer.keys
        out.append(d)
    return out


def snapshot_cache(cache):
    return [{k: (dict(v) if isinstance(v, dict) else v) for k, v in vars(layer).items()}
            for layer in cache.layers]


def restore_cache(cache, snap):
    # V4 cache updates rebind attributes (torch.cat / slicing), they never write into the
    # stored tensors, so restoring the attribute references restores the P-token state.
    for layer, state in zip(cache.layers, snap):
        layer.__dict__.update({k: (dict(v) if isinstance(v, dict) else v) for k, v in state.items()})


def check_cache_layout(model, template):
    """Compare the synthetic layout with a real chunked prefill; probe the CSA decode mask."""
    real = real_prefill_cache(model, CHECK_TOKENS, CHECK_CHUNK)
    synth = derive_cache(model, template, 1, CHECK_TOKENS, "random")
    a, b = cache_signature(real), cache_signature(synth)
    result = {"tokens": CHECK_TOKENS, "chunk": CHECK_CHUNK, "ok": a == b}
    if a != b:
        result["real"], result["synthetic"] = a, b
    # Probe what the CSA attention receives on a cached single-token step.
    layer_types = model.config.layer_types
    if "compressed_sparse_attention" in layer_types:
        idx = layer_types.index("compressed_sparse_attention")
        seen = {}

        def probe(module, args, kwargs):
            m = kwargs.get("attention_mask")
            seen["mask"] = None if m is None else list(m.shape)
        h = model.model.layers[idx].self_attn.register_forward_pre_hook(probe, with_kwargs=True)
        try:
            ids = torch.randint(0, model.config.vocab_size, (1, 1), device=model.device)
            model(input_ids=ids, past_key_values=real, use_cache=True, logits_to_keep=1)
        finally:
            h.remove()
        result["csa_decode_mask"] = seen.get("mask")
        result["csa_entries"] = CHECK_TOKENS // model.config.compress_rates["compressed_sparse_attention"]
    del real, synth
    return result


# ----------------------------------------------------------------------------- cases


def parse_case(text):
    """prefill:[Bx]T[@CHUNK]  |  decode:BxP[:synthetic|:real]"""
    kind, _, rest = text.partition(":")
    try:
        if kind == "prefill":
            body, _, chunk = rest.partition("@")
            b, _, t = body.rpartition("x")
            return {"name": text, "kind": "prefill", "batch": int(b or 1), "context": 0,
                    "tokens": int(t), "chunk": int(chunk) if chunk else None}
        if kind == "decode":
            body, _, mode = rest.partition(":")
            b, _, p = body.partition("x")
            if mode not in ("", "synthetic", "real"):
                raise ValueError(mode)
            return {"name": text, "kind": "decode", "batch": int(b), "context": int(p),
                    "tokens": 1, "cache": mode or None}
    except ValueError:
        pass
    sys.exit(f"error: bad case '{text}' (use prefill:T, prefill:BxT@CHUNK, decode:BxP[:real])")


def case_cost(case, cfg):
    """Bytes of the largest eager-attention temporary: a cheap-first sort key."""
    heads, dim = cfg.num_attention_heads, cfg.head_dim
    if case["kind"] == "prefill":
        t = case["tokens"]
        q = case["chunk"] or t
        return case["batch"] * heads * q * (q + t // 4) * 2 * (t // q)
    return case["batch"] * heads * (case["context"] // 4 + cfg.sliding_window) * dim * 2


def layer_kinds(cfg):
    return [KIND_OF_LAYER_TYPE[t] for t in cfg.layer_types]


def summarize(kinds, layer_ms_runs, fwd_runs):
    med_layers = [statistics.median(r[i] for r in layer_ms_runs) for i in range(len(kinds))]
    per_kind = {}
    for k in KIND_ORDER:
        vals = [m for m, kk in zip(med_layers, kinds) if kk == k]
        if vals:
            per_kind[k] = round(sum(vals) / len(vals), 3)
    return per_kind, [round(x, 3) for x in med_layers], round(statistics.median(fwd_runs), 3)


def run_case(case, ctx):
    """Set up and time one case; returns the result dict (raises on failure)."""
    model, args, cfg, timer = ctx["model"], ctx["args"], ctx["cfg"], ctx["timer"]
    dev = model.device
    t_case = time.time()
    rec = {"kind": case["kind"], "batch": case["batch"], "context": case["context"],
           "tokens": case["tokens"], "name": case["name"]}
    prepare = None
    if case["kind"] == "prefill":
        ids = torch.randint(0, cfg.vocab_size, (case["batch"], case["tokens"]), device=dev)
        if case["chunk"]:
            rec["chunk"] = case["chunk"]
            chunk = case["chunk"]

            def step():
                from transformers import DynamicCache
                cache = DynamicCache(config=model.config)
                for s in range(0, ids.shape[1], chunk):
                    model(input_ids=ids[:, s:s + chunk], past_key_values=cache,
                          use_cache=True, logits_to_keep=1)
        else:
            def step():
                model(input_ids=ids, use_cache=False, logits_to_keep=1)
    else:
        mode = case["cache"] or args.cache
        b, p = case["batch"], case["context"]
        if mode == "synthetic":
            cache = derive_cache(model, ctx["template"], b, p, "random")
            rec["cache"] = "synthetic"
        else:
            key = ("real", p)
            if key not in ctx["real_caches"]:
                ctx["real_caches"].clear()
                log(f"  real chunked prefill of {p} tokens (chunk {args.chunk}) for the cache")
                ctx["real_caches"][key] = real_prefill_cache(model, p, args.chunk)
            cache = derive_cache(model, ctx["real_caches"][key], b, p, "repeat")
            rec["cache"] = f"real: chunked prefill of {p} tokens at batch 1 (chunk {args.chunk}), repeated to batch {b}"
        if cache.get_seq_length() != p:
            raise RuntimeError(f"cache holds {cache.get_seq_length()} tokens, expected {p}")
        snap = snapshot_cache(cache)
        ids = torch.randint(0, cfg.vocab_size, (b, 1), device=dev)

        def prepare():
            restore_cache(cache, snap)

        def step():
            model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            if cache.get_seq_length() != p + 1:
                raise RuntimeError("decode step did not advance the cache by one token")
    if dev.type == "cuda":
        torch.cuda.synchronize()
    rec["setup_s"] = round(time.time() - t_case, 2)

    def one():
        if prepare:
            prepare()
        return timer.measure(step)

    deadline = min(time.time() + args.time_cap_s, ctx["deadline"])  # the cap covers timing, not setup
    warm = None
    for _ in range(max(1, args.warmup)):
        warm = one()
    rec["warmup_ms"] = round(warm[0], 3)
    nreps = args.reps if warm[0] <= args.long_ms else 1
    runs = []
    last_ms = warm[0]
    for _ in range(nreps):
        if time.time() + last_ms / 1e3 > deadline:
            break
        runs.append(one())
        last_ms = runs[-1][0]
    if runs:
        rec["reps"] = len(runs)
    else:
        runs = [warm]
        rec["reps"] = 0
        rec["warmup_only"] = True
    per_kind, med_layers, fwd = summarize(ctx["kinds"], [r[1] for r in runs], [r[0] for r in runs])
    rec["per_layer_ms"] = per_kind
    rec["layer_ms"] = med_layers
    rec["forward_ms"] = fwd
    if case["kind"] == "decode":
        prepare()  # leave nothing extra allocated by the last step
    return rec


def oom_reason(exc):
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, getattr(torch, "OutOfMemoryError", ())) or "out of memory" in msg.lower():
        return "OOM: " + msg[:300]
    return f"{type(exc).__name__}: {msg[:300]}"


def free_memory(dev):
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- output


def validate_results(res):
    """Return a list of structural problems of a results dict (empty when fine)."""
    errs = []
    for k in ("device", "torch", "transformers", "config", "layers", "cases", "notes"):
        if k not in res:
            errs.append(f"missing top-level key {k}")
    kinds = set(res.get("layers", []))
    for c in res.get("cases", []):
        for k in ("kind", "batch", "context", "tokens"):
            if k not in c:
                errs.append(f"case {c.get('name')}: missing {k}")
        if c.get("kind") not in ("prefill", "decode"):
            errs.append(f"case {c.get('name')}: bad kind")
        if "skipped" in c:
            if not isinstance(c["skipped"], str) or not c["skipped"]:
                errs.append(f"case {c.get('name')}: empty skip reason")
            continue
        for k in ("per_layer_ms", "forward_ms", "reps"):
            if k not in c:
                errs.append(f"case {c.get('name')}: missing {k}")
        if set(c.get("per_layer_ms", {})) != kinds:
            errs.append(f"case {c.get('name')}: per_layer_ms kinds {sorted(c.get('per_layer_ms', {}))} != {sorted(kinds)}")
        if not all(isinstance(v, float) and v > 0 for v in c.get("per_layer_ms", {}).values()):
            errs.append(f"case {c.get('name')}: non-positive layer time")
        if not (isinstance(c.get("forward_ms"), float) and c["forward_ms"] > 0):
            errs.append(f"case {c.get('name')}: bad forward_ms")
        if c.get("forward_ms", 0) < 0.9 * sum(c.get("layer_ms", [0])):
            errs.append(f"case {c.get('name')}: forward_ms below the sum of its layers")
    return errs


def print_table(res):
    kinds = [k for k in KIND_ORDER if k in res["layers"]]
    head = f"{'case':<22}{'B':>5}{'P':>8}{'T':>7}" + "".join(f"{k + ' ms':>11}" for k in kinds) \
        + f"{'fwd ms':>11}{'reps':>5}"
    print(f"transformers {res['transformers']} eager, torch {res['torch']}, {res['device']}, "
          f"layers {res['layers']}, experts={res['experts_implementation']}")
    print(head)
    for c in res["cases"]:
        lead = f"{c['name']:<22}{c['batch']:>5}{c['context']:>8}{c['tokens']:>7}"
        if "skipped" in c:
            print(lead + "  skipped: " + c["skipped"][:90])
        else:
            print(lead + "".join(f"{c['per_layer_ms'][k]:>11.2f}" for k in kinds)
                  + f"{c['forward_ms']:>11.2f}{c['reps']:>5}")
    sys.stdout.flush()


def write_json(res, path):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=1)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- main


def run(args):
    import transformers
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda but torch.cuda.is_available() is False")
    cfg, dropped = load_slice_config(args.model_dir)
    kinds = layer_kinds(cfg)
    cases = [parse_case(c) for part in args.cases for c in part.split(",") if c]
    cases.sort(key=lambda c: case_cost(c, cfg))
    log(f"slice: {cfg.num_hidden_layers} layers {kinds}, mlp {cfg.mlp_layer_types}; "
        f"dropped config keys {dropped}; {len(cases)} cases")

    res = {
        "device": (torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"),
        "device_memory_gb": (round(torch.cuda.get_device_properties(dev).total_memory / 2**30, 1)
                             if dev.type == "cuda" else None),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "attn_implementation": "eager", "experts_implementation": args.experts_impl,
        "dtype": "bfloat16", "config": config_summary(cfg, dropped), "layers": kinds,
        "cases": [], "notes": [],
    }
    notes = res["notes"]
    notes += [
        f"Random bf16 weights (N(0, 1/fan_in) matrices, embedding N(0,1), norm weights 1, "
        f"tid2eid rows = {cfg.num_experts_per_tok} distinct random experts, small random "
        f"e_score_correction_bias/HC base/sinks); config keys {dropped} dropped; no checkpoint read.",
        "Every parameter is bf16 (built with _from_config under torch.device). from_pretrained(dtype=bf16) "
        "would keep norms/HC/sinks in fp32 (_keep_in_fp32_modules_strict); with transformers 5.17 that "
        "forward fails (fp32 norm output into a bf16 Linear), seen on CPU with a tiny config.",
        f"attn_implementation=eager (V4 supports nothing else), experts_implementation={args.experts_impl} "
        "(transformers' own default is grouped_mm).",
        "per_layer_ms: median over reps of each decoder layer (mHC + attention incl. compressor/indexer "
        "+ MoE), averaged over the layers of a kind; forward_ms adds embedding, mask, hc_head, norm and "
        "lm_head on the last position (logits_to_keep=1). Timed with "
        + ("CUDA events" if dev.type == "cuda" else "time.perf_counter") + " in forward pre/post hooks.",
        "prefill: one forward, use_cache=False. Eager attention materializes [B, 64, T, T+entries] logits "
        "(bf16) several times at once (x*scale, +mask, cat sink, -max, softmax): ~3 copies live, so T=16384 "
        "needs ~96 GiB of temporaries besides the weights.",
        "Memory of eager decode at B > 1: torch.matmul materializes the single KV head broadcast to all 64 "
        "heads, B x 64 x (window + entries) x head_dim x 2 bytes for K and again for V (CSA: entries = P/4); "
        "at B = 1 it stays a stride-0 view.",
        "decode: one step at position P with 1 new token per sequence; the cache is restored to its "
        "P-token state before each repetition (P is a multiple of 4 and 128, so no compressor block "
        "closes in the timed step).",
        "spec 9.6: transformers' cached CSA decode is not a numerical reference (it disagrees with the full "
        "forward when index_topk < entries); this is fine for timing. Its cost is O(P): the indexer scores "
        "all P/4 compressed entries and eager attention computes logits over all P/4 entries plus the "
        "window (the top-k only enters as a -inf bias), HCA over all P/128.",
    ]

    t0 = time.time()
    log(f"building the model on {dev} (bf16, random weights) ...")
    model = build_model(cfg, dev, args.experts_impl, args.seed)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    res["model_gb"] = round(model_bytes(model) / 2**30, 2)
    res["build_s"] = round(time.time() - t0, 1)
    log(f"model built: {res['model_gb']} GiB of parameters in {res['build_s']} s")

    ctx = {"model": model, "args": args, "cfg": cfg, "kinds": kinds, "real_caches": {},
           "deadline": T_START + args.budget_s,
           "timer": LayerTimer(model.model.layers, dev)}

    with torch.inference_mode():
        t0 = time.time()
        ctx["template"] = real_prefill_cache(model, TEMPLATE_TOKENS, TEMPLATE_CHUNK)
        check = check_cache_layout(model, ctx["template"])
        res["cache_check"] = check
        log(f"cache layout check ({time.time() - t0:.1f} s): "
            f"{'ok' if check['ok'] else 'MISMATCH'}, CSA decode mask {check.get('csa_decode_mask')}")
        if args.cache == "synthetic":
            notes.append(
                f"decode cache (synthetic): template = real chunked prefill of {TEMPLATE_TOKENS} tokens at "
                f"batch 1 (chunks of {TEMPLATE_CHUNK}); per case every tensor of it (127-token window, "
                "compressed_kv P//ratio entries incl. the CSA indexer's, buffer_kv/gate P%ratio tokens, CSA "
                "overlap slices) is replaced by a random bf16 tensor at batch B and counters set to P. Layout "
                f"checked against a real chunked prefill of {CHECK_TOKENS} tokens: "
                f"{'identical' if check['ok'] else 'MISMATCH (see cache_check)'}.")
        else:
            notes.append(f"decode cache (real): chunked prefill of P tokens at batch 1 (chunk {args.chunk}), "
                         "every cache tensor repeated to batch B.")
        mask = check.get("csa_decode_mask")
        if "csa_decode_mask" in check:
            if mask is None:
                notes.append("Observed: the CSA layer gets attention_mask=None on a cached decode step, so the "
                             "indexer's top-k bias is dropped and all compressed entries are attended (spec 9.6).")
            else:
                notes.append(f"Observed: on a cached decode step the CSA layer gets an attention_mask of shape "
                             f"{mask}, so the indexer's top-k bias is concatenated (only top-k entries get "
                             "weight), yet logits are still computed for every compressed entry.")
        free_memory(dev)

        pending_fallback = []
        queue = list(cases)
        while queue:
            case = queue.pop(0)
            if time.time() > ctx["deadline"]:
                rec = {k: case[k] for k in ("kind", "batch", "context", "tokens", "name")}
                rec["skipped"] = "budget"
                res["cases"].append(rec)
                log(f"{case['name']}: skipped (budget {args.budget_s} s exceeded)")
                continue
            log(f"{case['name']}: start")
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            try:
                rec = run_case(case, ctx)
                if dev.type == "cuda":
                    rec["peak_mem_gb"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 1)
                log(f"{case['name']}: forward {rec['forward_ms']:.2f} ms, per layer {rec['per_layer_ms']}, "
                    f"reps {rec['reps']}")
            except Exception as exc:  # noqa: BLE001 - any failure is recorded, the run goes on
                reason = oom_reason(exc)
                rec = {k: case[k] for k in ("kind", "batch", "context", "tokens", "name")}
                rec["skipped"] = reason
                if args.verbose:
                    traceback.print_exc()
                log(f"{case['name']}: skipped: {reason}")
                if (case["kind"] == "prefill" and not case["chunk"] and reason.startswith("OOM")
                        and not args.no_chunked_fallback and case["tokens"] > args.chunk):
                    fb = dict(case, chunk=args.chunk, name=f"{case['name']}@{args.chunk}")
                    pending_fallback.append(fb)
            res["cases"].append(rec)
            free_memory(dev)
            if not queue and pending_fallback:
                queue, pending_fallback = pending_fallback, []
            write_json(res, args.out)
        ctx["timer"].remove()

    res["wall_s"] = round(time.time() - T_START, 1)
    problems = validate_results(res)
    res["structure_problems"] = problems
    write_json(res, args.out)
    print_table(res)
    log(f"done in {res['wall_s']} s; results in {args.out}")
    if problems:
        log("structure problems: " + "; ".join(problems))
    return res


def selftest(args):
    """Tiny CPU run: prefill 512, decode B=2 P=1024 (synthetic and real cache), structure checks."""
    d = tempfile.mkdtemp(prefix="gpu_layers_hf_selftest_")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(tiny_config_dict(), f)
    args.model_dir = d
    args.device = "cpu"
    args.cases = ["prefill:512", "decode:2x1024", "decode:2x1024:real", "prefill:1024@512"]
    args.out = args.out or os.path.join(d, "results.json")
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    res = run(args)
    with open(args.out) as f:
        back = json.load(f)
    fails = validate_results(back)
    if back["layers"] != ["SWA", "SWA", "CSA", "HCA"]:
        fails.append(f"layers {back['layers']}")
    if set(back["config"]["dropped_keys"]) != {"quantization_config", "expert_dtype", "torch_dtype"}:
        fails.append(f"dropped keys {back['config']['dropped_keys']}")
    if not back["cache_check"]["ok"]:
        fails.append("synthetic cache layout differs from a real chunked prefill")
    names = [c["name"] for c in back["cases"]]
    for want in args.cases:
        if want not in names:
            fails.append(f"case {want} missing")
    for c in back["cases"]:
        if "skipped" in c:
            fails.append(f"case {c['name']} skipped: {c['skipped']}")
        elif c["reps"] < 1:
            fails.append(f"case {c['name']} has no timed repetition")
    if res["experts_implementation"] != args.experts_impl:
        fails.append("experts implementation not recorded")
    if fails:
        print("SELFTEST FAILED:\n  " + "\n  ".join(fails))
        return 1
    print(f"SELFTEST PASSED ({len(back['cases'])} cases, results in {args.out})")
    return 0


def main(argv=None):
    global torch
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", nargs="?", help="directory holding the slice's config.json")
    ap.add_argument("--out", help="results JSON (rewritten after every case)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cases", nargs="+", default=DEFAULT_CASES,
                    help="prefill:T | prefill:BxT@CHUNK | decode:BxP[:real|:synthetic] (default: all)")
    ap.add_argument("--time-cap-s", type=float, default=60.0, help="per-case wall cap for repetitions")
    ap.add_argument("--budget-s", type=float, default=330.0,
                    help="no new case starts after this many seconds from process start")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--long-ms", type=float, default=2000.0,
                    help="a case whose warm-up forward takes longer is timed once")
    ap.add_argument("--cache", choices=("synthetic", "real"), default="synthetic",
                    help="how decode caches are built (see module docstring)")
    ap.add_argument("--chunk", type=int, default=4096,
                    help="chunk for real-cache prefill and for the OOM fallback of prefill")
    ap.add_argument("--no-chunked-fallback", action="store_true",
                    help="do not time a chunked prefill when the one-shot prefill runs out of memory")
    ap.add_argument("--experts-impl", default="grouped_mm", choices=("eager", "grouped_mm", "batched_mm"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--verbose", action="store_true", help="print tracebacks of skipped cases")
    ap.add_argument("--tiny-selftest", action="store_true",
                    help="tiny config on CPU: prefill 512 + decode B=2 P=1024, check the JSON")
    args = ap.parse_args(argv)
    import torch as _torch
    torch = _torch
    if args.tiny_selftest:
        return selftest(args)
    if not args.model_dir or not args.out:
        ap.error("MODEL_DIR and --out are required (or use --tiny-selftest)")
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
