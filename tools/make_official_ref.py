#!/usr/bin/env python3
"""Reference logits for `--semantics official`: transformers 5.17 plus the official QAT round trips.

Usage:
    python tools/make_official_ref.py [--only NAME ...] [--threads N] [--selftest]

Needs torch + transformers 5.17 (DeepseekV4ForCausalLM).  Default fixtures: tiny-mixed,
tiny-hash-swa, tiny-hca16 (tests/fixtures/model/<NAME>/).  For each it loads the checkpoint the
way tools/make_v4_fixtures.py does (from_pretrained, float32, eager attention), runs ONE full
forward without cache over ref.json's input_ids, and writes next to ref.json:

  ref_official_logits.f32   raw little-endian float32 [S, V], every position
  ref_official.json         provenance, the patch list, self-checks and the boundary diagnostics

What is patched (the points where DeepSeek's inference/model.py + kernel.py differ from
transformers; docs/MODEL-OFFICIAL-ORACLE.md has the line-by-line evidence).  Everything else is
transformers' own code.  The quantisers below are written from the formats' definitions:

  1. window KV       after kv_norm + RoPE, channels [0, head_dim - rope_dim) go through an FP8
                     e4m3fn round trip per token, blocks of 64 along the channels (a trailing short
                     block is its own block), scale 2^ceil(log2(max(amax, 1e-4) * fl32(1/448))).
  2. compressed KV   (main compressor of CSA and HCA layers) after kv_norm + RoPE: the same.
  3. indexer keys    after kv_norm + RoPE: Hadamard over all index_head_dim channels (Sylvester
                     order, times n^-1/2), then FP4 e2m1 round trip in blocks of 32, scale
                     2^ceil(log2(max(amax, 6*2^-126) * fl32(1/6))).
  4. indexer queries after RoPE: Hadamard + FP4 as in 3.
  5. router          weights = s / sum(s) (no + 1e-20), times routed_scaling_factor.
  6. routed experts  the routing weight multiplies the clamped SwiGLU output BEFORE down_proj (w2).
  7. tie order       not a semantic point: among EQUAL indexer scores the lower entry index is kept
                     (the engine's documented rule); both references leave it to torch.topk.
  8. GEMM activations model.py linear(): before every FP8 / FP4 GEMM the activation goes through
                     act_quant (FP8 e4m3fn round trip per row, blocks of 128 along the input, the
                     scale of 1) and the GEMM multiplies it with the dequantised weight.  Which GEMMs:
                     the weights stored FP8 / FP4 in the checkpoint among those model.py runs
                     through linear(): wq_a, wq_b, wkv, wo_b, the indexer's wq_b, the shared
                     expert's w1/w3/w2, the routed experts' w1/w3 (on x) and w2 (on the weighted
                     SwiGLU output).  Not wo_a (an einsum on the dequantised weight), not the
                     compressors, weights_proj, router or head (declared bf16 / fp32).  Only the
                     quantised fixture (tiny-mixed-fp8fp4) has such weights: the oracle loads its
                     dequantised twin into transformers and reads the dtypes from the quantised
                     checkpoint; on the bf16 fixtures this point does nothing.

Rounding (the real tilelang kernels cast to the format; kernel.py's torch port only clamps):
FP8 = clamp to +-448, then torch's float32 -> float8_e4m3fn cast (round to nearest even) and
back; FP4 = clamp to +-6, then nearest e2m1 magnitude {0, .5, 1, 1.5, 2, 3, 4, 6} with ties to
the even mantissa.  All arithmetic in float32.

How the patches hook in (one-shot forward, use_cache=False):
  * 1 + 2: DeepseekV4Attention hands eager_attention_forward K = V = [window kv (S rows, after
    kv_norm + RoPE) ; compressed entries (T rows, after kv_norm + RoPE)]; nothing else reads
    either tensor.  The wrapper round-trips rows [0, S) (window) and [S, S+T) (compressed).
  * 3 + 4: DeepseekV4IndexerScorer.forward receives the indexer queries after RoPE and the
    indexer's compressed keys after kv_norm + RoPE, and is their only reader.
  * 5: DeepseekV4TopKRouter / DeepseekV4HashRouter forward replaced (same selection code).
  * 6: DeepseekV4Experts.forward replaced by an eager loop with the weight before down_proj.
  * 7: Tensor.topk, while DeepseekV4Indexer.forward runs, returns the stable choice.
Every switch off => the wrappers call transformers' originals untouched; --selftest (and every
run) checks that this gives transformers' logits bit for bit and that each switch alone changes
them.

Boundary diagnostics (ref_official.json "diagnostics"): our fp32 engine and torch differ in the
last bits, so a quantiser input within ~1e-6 of a rounding midpoint can round the other way, a
block whose amax*fl32(1/448) sits at a power of two can change scale, and an indexer/router score
near-tie can change a top-k choice.  Recorded per fixture and site: how many elements lie within
1e-5 relative of a rounding midpoint (and which), blocks within 1e-5 of a scale boundary, the
smallest relative gap at every indexer and router top-k boundary, exact ties.  Then one "flip
experiment" per candidate: the official forward again with only that element / block scale / top-k
boundary taken the other way, recording which positions move by > 1e-4 and by how much; the test
(tests/py/test_model_official.py) accepts a position above 1e-4 only if such an experiment covers it.
"""
import argparse
import hashlib
import json
import math
import os
import platform
import sys

import torch
import torch.nn.functional as F

import transformers
from transformers import DeepseekV4ForCausalLM
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as MV

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE_ROOT = os.path.join(ROOT, "tests", "fixtures", "model")
DEFAULT_FIXTURES = ["tiny-mixed", "tiny-hash-swa", "tiny-hca16", "tiny-mixed-fp8fp4"]
# fixture -> the checkpoint transformers loads (a quantised fixture's dequantised twin, same values)
MODEL_DIR = {"tiny-mixed-fp8fp4": "tiny-mixed-fp8fp4-twin"}

FP8_MAX = 448.0
FP4_MAX = 6.0
FP8_AMAX_FLOOR = 1e-4
FP4_AMAX_FLOOR = 6.0 * 2.0 ** -126
FP8_BLOCK = 64     # window / compressed KV (model.py: act_quant(kv[..., :-rd], 64, ...))
FP4_BLOCK = 32     # indexer (model.py: fp4_block_size = 32)
ACT_BLOCK = 128    # GEMM activations (model.py: block_size = 128)
NEAR_MID = 1e-5    # "near a rounding midpoint": relative distance below this
NEAR_TIE = 1e-3    # top-k boundaries listed when their relative gap is below this
E2M1_MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)

PATCHES = ("window_kv_fp8", "compressed_kv_fp8", "indexer_k_hadamard_fp4", "indexer_q_hadamard_fp4",
           "router_no_eps", "expert_weight_before_w2", "indexer_ties_lower_index", "gemm_act_fp8")
PATCH_DOC = {
    "window_kv_fp8": "window KV after kv_norm+RoPE: channels [0, head_dim-rope_dim) FP8 e4m3fn round trip, "
                     "blocks of 64 per token, scale 2^ceil(log2(max(amax,1e-4)*fl32(1/448)))",
    "compressed_kv_fp8": "main-compressor entries (CSA and HCA) after kv_norm+RoPE: same FP8 round trip on the "
                         "non-RoPE channels",
    "indexer_k_hadamard_fp4": "indexer compressor entries after kv_norm+RoPE: Sylvester Hadamard * n^-1/2 over all "
                              "index_head_dim channels, then FP4 e2m1 round trip in blocks of 32, scale "
                              "2^ceil(log2(max(amax,6*2^-126)*fl32(1/6)))",
    "indexer_q_hadamard_fp4": "indexer queries after RoPE: same Hadamard + FP4 round trip",
    "router_no_eps": "routing weights s/sum(s) (no +1e-20) * routed_scaling_factor, top-k and hash selection "
                     "unchanged",
    "expert_weight_before_w2": "routed experts: routing weight multiplies the clamped SwiGLU output before "
                               "down_proj (w2)",
    "indexer_ties_lower_index": "not a semantic point: among EQUAL indexer scores the lower entry index is kept "
                                "(stable descending sort), the engine's documented rule; both references leave "
                                "the order of ties to torch.topk (unspecified)",
    "gemm_act_fp8": "model.py linear(): the input of every GEMM whose weight is FP8 / FP4 in the checkpoint (wq_a, "
                    "wq_b, wkv, wo_b, indexer wq_b, shared and routed w1/w3/w2; not wo_a, compressors, "
                    "weights_proj, router, head) goes through act_quant: FP8 round trip per row in blocks of 128, "
                    "scale 2^ceil(log2(max(amax,1e-4)*fl32(1/448)))",
}

# checkpoint name (official or transformers naming) -> (module path under the decoder layer, site); experts apart
ACT_ROLES = {
    # one site per tensor the engine quantises once: x of the attention (wq_a, wkv), qr (wq_b, the indexer's wq_b),
    # x of the FFN (routed w1 / w3, shared w1 / w3), u (wo_b), the shared expert's h; a routed expert's h apart
    "attn.wq_a": ("self_attn.q_a_proj", "act_attn_x"), "self_attn.q_a_proj": ("self_attn.q_a_proj", "act_attn_x"),
    "attn.wkv": ("self_attn.kv_proj", "act_attn_x"), "self_attn.kv_proj": ("self_attn.kv_proj", "act_attn_x"),
    "attn.wq_b": ("self_attn.q_b_proj", "act_qr"), "self_attn.q_b_proj": ("self_attn.q_b_proj", "act_qr"),
    "attn.indexer.wq_b": ("self_attn.compressor.indexer.q_b_proj", "act_qr"),
    "self_attn.compressor.indexer.q_b_proj": ("self_attn.compressor.indexer.q_b_proj", "act_qr"),
    "attn.wo_b": ("self_attn.o_b_proj", "act_wo_b"), "self_attn.o_b_proj": ("self_attn.o_b_proj", "act_wo_b"),
    "ffn.shared_experts.w1": ("mlp.shared_experts.gate_proj", "act_ffn_x"),
    "ffn.shared_experts.w3": ("mlp.shared_experts.up_proj", "act_ffn_x"),
    "ffn.shared_experts.w2": ("mlp.shared_experts.down_proj", "act_shared_w2"),
    "mlp.shared_experts.gate_proj": ("mlp.shared_experts.gate_proj", "act_ffn_x"),
    "mlp.shared_experts.up_proj": ("mlp.shared_experts.up_proj", "act_ffn_x"),
    "mlp.shared_experts.down_proj": ("mlp.shared_experts.down_proj", "act_shared_w2"),
}
QUANT_DTYPES = ("F8_E4M3", "I8", "U8", "F4")


def quantised_roles(d):
    """From the checkpoint's safetensors headers: {(layer, module path, site)} of the GEMMs act_quant runs before,
    and {layer: (experts whose w1 and w3 are quantised, experts whose w2 is)}."""
    import re
    import struct
    dtypes = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with open(os.path.join(d, f), "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                for k, v in json.loads(fh.read(n)).items():
                    if k != "__metadata__":
                        dtypes[k] = v["dtype"]
    lin, experts = set(), {}
    mod_of = {v[0]: k for k, v in ACT_ROLES.items()}
    for k, dt in dtypes.items():
        m = re.match(r"(?:model\.)?layers\.(\d+)\.(.+)\.weight$", k)
        if not m or dt not in QUANT_DTYPES:
            continue
        li, name = int(m.group(1)), m.group(2)
        if name in ACT_ROLES:
            lin.add((li, *ACT_ROLES[name], name))
            continue
        e = re.match(r"ffn\.experts\.(\d+)\.(w[123])$", name)
        if e:
            ins, outs = experts.setdefault(li, (set(), set()))
            (outs if e.group(2) == "w2" else ins).add(int(e.group(1)))
    return lin, experts


# --------------------------------------------------------------------------------------------
# quantisers (float32)
# --------------------------------------------------------------------------------------------

def pow2_ceil(v):
    """2^ceil(log2 v) for v > 0, exact (frexp: v = m * 2^e, m in [0.5, 1))."""
    m, e = torch.frexp(v)
    e = e - (m == 0.5).to(e.dtype)
    return torch.ldexp(torch.ones_like(v), e)


def _blocks(x, block):
    """[..., N] -> list of (lo, hi) channel ranges; a trailing short block is its own block."""
    n = x.shape[-1]
    return [(lo, min(lo + block, n)) for lo in range(0, n, block)]


def _scale(amax, floor, inv_max):
    amax = amax.clamp_min(floor)
    r = amax * torch.tensor(inv_max, dtype=torch.float32)   # kernel: amax * fl32(1/max)
    return pow2_ceil(r), r


def e4m3_round(v):
    """|v| <= 448 -> nearest e4m3fn value, ties to even (torch's fp8 cast)."""
    return v.to(torch.float8_e4m3fn).to(torch.float32)


def e2m1_round(v):
    """|v| <= 6 -> nearest e2m1 value {0,.5,1,1.5,2,3,4,6}, ties to even mantissa.
    Step 0.5 below 2, 1 in [2,4), 2 in [4,6]; torch.round is half-to-even, and on each of these
    uniform grids the even multiple of the step is exactly the even-mantissa code."""
    a = v.abs()
    step = torch.where(a < 2, torch.full_like(a, 0.5), torch.where(a < 4, torch.ones_like(a), torch.full_like(a, 2.0)))
    return torch.copysign(torch.round(a / step) * step, v)


def e4m3_mid(v):
    """Nearest e4m3 rounding midpoint to |v| (<= 448), and the relative distance to it."""
    a = v.abs().double()
    e = torch.floor(torch.log2(a.clamp_min(2.0 ** -6)))
    step = torch.pow(2.0, e - 3)                       # 3 mantissa bits; subnormal step 2^-9
    hi = (torch.floor(a / step) + 0.5) * step
    lo = hi - step
    mid = torch.where((a - lo).abs() < (hi - a).abs(), lo, hi)
    return mid, ((a - mid).abs() / a.clamp_min(1e-300)).float()


def e2m1_mid(v):
    a = v.abs().double()
    mids = torch.tensor(E2M1_MIDS, dtype=torch.float64)
    d = (a.unsqueeze(-1) - mids).abs()
    mid = mids[d.argmin(-1)]
    return mid, (d.min(-1).values / a.clamp_min(1e-300)).float()


def pow2_gap(r):
    """Nearest power of two to r, and the relative distance to it (scale boundary)."""
    r = r.double()
    p = torch.pow(2.0, torch.round(torch.log2(r)))
    return p, ((r - p).abs() / p).float()


class Diag:
    """Collects boundary statistics while the patched forward runs."""

    def __init__(self):
        self.sites = {}
        self.near = []          # [site, layer, row, head, channel, rel gap]
        self.near_scale = []    # [site, layer, row, head, first channel of the block, rel gap]
        self.indexer = []       # (layer, ratio, k, scores [S, T])
        self.router = []        # (layer, k, selection scores [S, E])
        self.tie_rows = []      # [layer, position] where torch.topk and the stable order pick different sets

    def site(self, name):
        return self.sites.setdefault(name, {"elements": 0, "blocks": 0, "near_midpoint": 0, "min_mid_gap": math.inf,
                                            "scale_near_pow2": 0, "min_scale_gap": math.inf,
                                            "scale_div_vs_mul_differs": 0, "amax_at_floor": 0})

    def record(self, name, layer, v, r, amax, floor, fmt, max_v, ch0, tok=None):
        """v: x/scale [rows, heads, block], r: amax*inv [rows, heads, 1]; ch0: channel of v[..., 0]; tok: the
        token of each row (default the row index)."""
        if tok is None:
            tok = list(range(v.shape[0]))
        st = self.site(name)
        _, gap = e4m3_mid(v) if fmt == "e4m3" else e2m1_mid(v)
        nz = v != 0
        st["elements"] += v.numel()
        st["blocks"] += r.numel()
        near = (gap < NEAR_MID) & nz
        st["near_midpoint"] += int(near.sum())
        if nz.any():
            st["min_mid_gap"] = min(st["min_mid_gap"], float(gap[nz].min()))
        for idx in near.nonzero().tolist():
            self.near.append([name, layer, tok[idx[0]], idx[1], ch0 + idx[2], float(gap[tuple(idx)])])
        _, sg = pow2_gap(r)
        st["scale_near_pow2"] += int((sg < NEAR_MID).sum())
        st["min_scale_gap"] = min(st["min_scale_gap"], float(sg.min()))
        for idx in (sg < NEAR_MID).nonzero().tolist():
            self.near_scale.append([name, layer, tok[idx[0]], idx[1], ch0, float(sg[tuple(idx)])])
        # the engine computes amax / max, the kernel amax * fl32(1/max): same power of two?
        a = amax.clamp_min(floor)
        st["scale_div_vs_mul_differs"] += int((pow2_ceil(a / max_v) != pow2_ceil(r)).sum())
        st["amax_at_floor"] += int((amax < floor).sum())


class Official:
    """The switches.  All off => transformers' forward, bit for bit."""

    def __init__(self, on=True):
        self.on = {p: on for p in PATCHES}
        self.diag = None
        self.calls = {p: 0 for p in PATCHES}
        self.in_indexer = None
        self.tie_rows = []
        self.force = []         # elements forced to round the other way: [site, layer, row, head, channel]
        self.force_scale = []   # blocks forced to the other scale: [site, layer, row, head, first channel]
        self.swap = []          # top-k boundaries forced the other way: [indexer_topk|router_topk, layer, position]


STATE = Official(on=False)


def fq(x, block, fmt, site=None, layer=-1, rows=None):
    """Quantise-dequantise x [rows, heads, N] along the last axis in blocks (float32, new tensor).  rows: the
    token of each row (default: the row index), as the diagnostics and the forced flips name them."""
    assert x.dim() == 3
    tok = list(range(x.shape[0])) if rows is None else [int(t) for t in rows]
    at = {t: r for r, t in enumerate(tok)}
    x = x.to(torch.float32)
    y = x.clone()
    if fmt == "e4m3":
        floor, inv, vmax, rnd, mid_fn = FP8_AMAX_FLOOR, 1.0 / FP8_MAX, FP8_MAX, e4m3_round, e4m3_mid
    else:
        floor, inv, vmax, rnd, mid_fn = FP4_AMAX_FLOOR, 1.0 / FP4_MAX, FP4_MAX, e2m1_round, e2m1_mid
    for lo, hi in _blocks(x, block):
        xb = x[..., lo:hi]
        amax = xb.abs().amax(-1, keepdim=True)
        s, r = _scale(amax, floor, inv)
        for f in STATE.force_scale:        # experiment: this block takes the other power of two
            if f[0] == site and f[1] == layer and f[4] == lo and f[2] in at:
                rr = at[f[2]]
                p, _ = pow2_gap(r[rr, f[3], 0])
                s[rr, f[3], 0] = float(p) if float(r[rr, f[3], 0]) > float(p) else 2 * float(p)
        v = (xb / s).clamp(-vmax, vmax)
        q = rnd(v)
        for f in STATE.force:              # experiment: this element rounds the other way
            if f[0] == site and f[1] == layer and lo <= f[4] < hi and f[2] in at:
                rr = at[f[2]]
                e = v[rr, f[3], f[4] - lo]
                m, _ = mid_fn(e)
                m = float(m)
                side = -1.0 if abs(float(q[rr, f[3], f[4] - lo])) > m else 1.0
                q[rr, f[3], f[4] - lo] = rnd(torch.copysign(torch.tensor(m * (1 + side * 1e-3)), e))
        y[..., lo:hi] = q * s
        if site is not None and STATE.diag is not None:
            STATE.diag.record(site, layer, v, r, amax, floor, fmt, vmax, lo, tok)
    return y


_HAD = {}


def hadamard(x):
    """Sylvester-order Walsh-Hadamard along the last axis, times n^-1/2 (n a power of two), fp32."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"Hadamard size {n} is not a power of two")
    if n not in _HAD:
        h = torch.ones(1, 1)
        while h.shape[0] < n:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        _HAD[n] = h
    return (x.to(torch.float32) @ _HAD[n]) * (n ** -0.5)


# --------------------------------------------------------------------------------------------
# patches
# --------------------------------------------------------------------------------------------

ORIG = {}


def _attn_wrapper(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
    st = STATE
    w, c = st.on["window_kv_fp8"], st.on["compressed_kv_fp8"]
    if not (w or c):
        return ORIG["eager"](module, query, key, value, attention_mask, scaling, dropout=dropout, **kw)
    assert key is value, "V4 attention is K=V"
    cfg = module.config
    S = query.shape[2]
    nope = cfg.head_dim - cfg.qk_rope_head_dim
    kv = key.clone()                               # [B, 1, S + T, head_dim]
    li = module.layer_idx
    if w:
        st.calls["window_kv_fp8"] += 1
        part = kv[:, :, :S, :nope]
        kv[:, :, :S, :nope] = fq(part.reshape(-1, 1, nope), FP8_BLOCK, "e4m3", "window_kv", li).reshape(part.shape)
    if c and kv.shape[2] > S:
        st.calls["compressed_kv_fp8"] += 1
        part = kv[:, :, S:, :nope]
        kv[:, :, S:, :nope] = fq(part.reshape(-1, 1, nope), FP8_BLOCK, "e4m3", "compressed_kv", li).reshape(part.shape)
    return ORIG["eager"](module, query, kv, kv, attention_mask, scaling, dropout=dropout, **kw)


def _scorer_forward(self, q, compressed_kv, hidden_states):
    st = STATE
    li = getattr(self, "_oracle_layer", -1)
    if st.on["indexer_q_hadamard_fp4"]:
        st.calls["indexer_q_hadamard_fp4"] += 1
        B, S, H, D = q.shape
        q = fq(hadamard(q).reshape(B * S, H, D), FP4_BLOCK, "e2m1", "indexer_q", li).reshape(B, S, H, D)
    if st.on["indexer_k_hadamard_fp4"]:
        st.calls["indexer_k_hadamard_fp4"] += 1
        B, T, D = compressed_kv.shape
        compressed_kv = fq(hadamard(compressed_kv).reshape(B * T, 1, D), FP4_BLOCK, "e2m1", "indexer_k", li
                           ).reshape(B, T, D)
    out = ORIG["scorer"](self, q, compressed_kv, hidden_states)
    if st.diag is not None:
        st.diag.indexer.append((li, self._oracle_ratio, self._oracle_topk, out[0].detach().clone()))
    return out


def _indexer_forward(self, *args, **kwargs):
    STATE.in_indexer = self
    try:
        return ORIG["indexer"](self, *args, **kwargs)
    finally:
        STATE.in_indexer = None


def _tensor_topk(self, k, dim=-1, largest=True, sorted=True):
    """Tensor.topk; inside DeepseekV4Indexer.forward (its only caller there: the entry selection) it
    compares torch's choice with the stable one (lower index first among equal scores) and, with
    indexer_ties_lower_index on, returns the stable one."""
    res = ORIG["tensor_topk"](self, k, dim=dim, largest=largest, sorted=sorted)
    ind = getattr(STATE, "in_indexer", None)
    if ind is None or not largest or dim not in (-1, self.dim() - 1):
        return res
    v, i = torch.sort(self, dim=-1, descending=True, stable=True)
    v, i = v[..., :k], i[..., :k]
    # compare the chosen sets, ignoring masked (-inf, not yet visible) picks, which attention drops
    big = self.shape[-1]
    a = torch.where(torch.isfinite(res.values), res.indices, big).sort(-1).values
    b = torch.where(torch.isfinite(v), i, big).sort(-1).values
    rows = (a != b).any(-1).reshape(-1).nonzero().reshape(-1).tolist()
    STATE.tie_rows.extend([getattr(ind.scorer, "_oracle_layer", -1), r] for r in rows)
    if STATE.on["indexer_ties_lower_index"]:
        STATE.calls["indexer_ties_lower_index"] += 1
        li = getattr(ind.scorer, "_oracle_layer", -1)
        for sw in STATE.swap:              # experiment: the (k+1)-th entry replaces the k-th
            if sw[0] == "indexer_topk" and sw[1] == li:
                order = torch.sort(self[0, sw[2]], descending=True, stable=True).indices
                i = i.clone()
                i[0, sw[2], k - 1] = order[k]
        return torch.return_types.topk((v, i))
    return res


def _route(self, hidden_states, indices_fn):
    flat = hidden_states.reshape(-1, self.hidden_dim)
    logits = F.linear(flat, self.weight)
    scores = self.score_fn(logits)
    indices = indices_fn(scores)
    weights = scores.gather(1, indices)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return logits, weights * self.routed_scaling_factor, indices


def _topk_router_forward(self, hidden_states):
    st = STATE
    if st.diag is not None:
        flat = hidden_states.reshape(-1, self.hidden_dim)
        sel = self.score_fn(F.linear(flat, self.weight)) + self.e_score_correction_bias
        st.diag.router.append((getattr(self, "_oracle_layer", -1), self.top_k, sel.detach().clone()))
    if not st.on["router_no_eps"]:
        return ORIG["topk_router"](self, hidden_states)
    st.calls["router_no_eps"] += 1
    li = getattr(self, "_oracle_layer", -1)

    def select(s):
        sel = s + self.e_score_correction_bias
        idx = torch.topk(sel, self.top_k, dim=-1, sorted=False).indices
        for sw in st.swap:                 # experiment: the (k+1)-th expert replaces the k-th
            if sw[0] == "router_topk" and sw[1] == li:
                order = torch.sort(sel[sw[2]], descending=True, stable=True).indices
                idx = idx.clone()
                idx[sw[2]] = torch.cat([order[:self.top_k - 1], order[self.top_k:self.top_k + 1]])
        return idx
    return _route(self, hidden_states, select)


def _hash_router_forward(self, hidden_states, input_ids):
    st = STATE
    if not st.on["router_no_eps"]:
        return ORIG["hash_router"](self, hidden_states, input_ids)
    st.calls["router_no_eps"] += 1
    return _route(self, hidden_states, lambda s: self.tid2eid[input_ids.reshape(-1)].long())


def _experts_forward(self, hidden_states, top_k_index, top_k_weights):
    st = STATE
    before = st.on["expert_weight_before_w2"]
    ins, outs = getattr(self, "_oracle_aq", (set(), set()))
    aq = st.on["gemm_act_fp8"] and (ins or outs)
    if not (before or aq):
        return ORIG["experts"](self, hidden_states, top_k_index, top_k_weights)
    if before:
        st.calls["expert_weight_before_w2"] += 1
    if aq:
        st.calls["gemm_act_fp8"] += 1
    li = getattr(self, "_oracle_layer", -1)
    final = torch.zeros_like(hidden_states)
    xq = None
    if aq and ins:                                                                 # act_quant before w1 / w3:
        D = hidden_states.shape[-1]                                                # per token, shared with the
        xq = fq(hidden_states.reshape(-1, 1, D), ACT_BLOCK, "e4m3", "act_ffn_x", li).reshape(hidden_states.shape)
    for e in range(self.num_experts):
        tok, kpos = torch.where(top_k_index == e)
        if tok.numel() == 0:
            continue
        x = (xq if xq is not None and e in ins else hidden_states)[tok]            # shared expert's hooks
        h = self._apply_gate(F.linear(x, self.gate_up_proj[e]))                    # clamp, silu(gate) * up
        w = top_k_weights[tok, kpos, None]
        if before:
            h = h * w                                                              # weight BEFORE w2
        if aq and e in outs:                                                       # act_quant before w2
            h = fq(h.reshape(-1, 1, h.shape[-1]), ACT_BLOCK, "e4m3", f"act_expert{e}_w2", li, rows=tok).reshape(h.shape)
        y = F.linear(h, self.down_proj[e])
        final.index_add_(0, tok, (y if before else y * w).to(final.dtype))
    return final


def _act_pre_hook(module, args):
    """forward pre-hook on a quantised GEMM's nn.Linear: its input through act_quant (gemm_act_fp8)."""
    if not STATE.on["gemm_act_fp8"]:
        return None
    STATE.calls["gemm_act_fp8"] += 1
    x = args[0]
    q = fq(x.reshape(-1, 1, x.shape[-1]), ACT_BLOCK, "e4m3", module._oracle_site, module._oracle_layer)
    return (q.reshape(x.shape).to(x.dtype),) + tuple(args[1:])


_TARGETS = (("eager", MV, "eager_attention_forward", _attn_wrapper),
            ("scorer", MV.DeepseekV4IndexerScorer, "forward", _scorer_forward),
            ("topk_router", MV.DeepseekV4TopKRouter, "forward", _topk_router_forward),
            ("hash_router", MV.DeepseekV4HashRouter, "forward", _hash_router_forward),
            ("experts", MV.DeepseekV4Experts, "forward", _experts_forward),
            ("indexer", MV.DeepseekV4Indexer, "forward", _indexer_forward),
            ("tensor_topk", torch.Tensor, "topk", _tensor_topk))


HOOKS = []


def install(model, roles=(set(), {})):
    """Install the wrappers, tag the per-layer modules with their layer index, hook the quantised GEMMs."""
    for key, owner, attr, fn in _TARGETS:
        if key not in ORIG:
            ORIG[key] = getattr(owner, attr)
        setattr(owner, attr, fn)
    lin, experts = roles
    if not HOOKS:
        for li, path, site, _ in sorted(lin):
            mod = model.model.layers[li].get_submodule(path)
            mod._oracle_layer, mod._oracle_site = li, site
            HOOKS.append(mod.register_forward_pre_hook(_act_pre_hook))
    for li, layer in enumerate(model.model.layers):
        layer.mlp.experts._oracle_layer = li
        layer.mlp.experts._oracle_aq = experts.get(li, (set(), set()))
        comp = layer.self_attn.compressor
        if isinstance(comp, MV.DeepseekV4CSACompressor):
            sc = comp.indexer.scorer
            sc._oracle_layer = li
            sc._oracle_ratio, sc._oracle_topk = comp.indexer.compress_rate, comp.indexer.index_topk
        layer.mlp.gate._oracle_layer = li


def uninstall():
    """Put transformers' (and torch's) originals back, remove the hooks."""
    for key, owner, attr, _ in _TARGETS:
        if key in ORIG:
            setattr(owner, attr, ORIG[key])
    while HOOKS:
        HOOKS.pop().remove()


# --------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------

def load(path):
    model, info = DeepseekV4ForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager",
                                                        output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise RuntimeError(f"loading {path}: {bad}")
    return model.eval()


def forward(model, ids, on=None, diag=False, force=(), force_scale=(), swap=()):
    """One full forward without cache; `on`: the set of patches switched on; `force` /
    `force_scale`: quantised elements / blocks made to round the other way (flip experiments)."""
    for p in PATCHES:
        STATE.on[p] = p in (on or ())
        STATE.calls[p] = 0
    STATE.tie_rows = []
    STATE.force, STATE.force_scale, STATE.swap = list(force), list(force_scale), list(swap)
    STATE.diag = Diag() if diag else None
    with torch.no_grad():
        logits = model(torch.tensor([ids]), use_cache=False).logits[0].float()
    d, STATE.diag = STATE.diag, None
    if d is not None:
        d.tie_rows = list(STATE.tie_rows)
    return logits, dict(STATE.calls), d


def ranges(ps):
    """[1, 2, 3, 7] -> [[1, 3], [7, 7]] (inclusive)."""
    out = []
    for p in ps:
        if out and out[-1][1] == p - 1:
            out[-1][1] = p
        else:
            out.append([p, p])
    return out


def rel_rows(a, b):
    return ((a - b).abs().amax(-1) / b.abs().amax(-1)).tolist()


def gap(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def topk_report(diag, cfg):
    rep = {"indexer": {"boundaries_checked": 0, "min_rel_gap": None, "near_ties": [], "exact_ties": [],
                       "near_ties_format": "[layer, position, relative gap, k-th score, (k+1)-th score]"},
           "router": {"boundaries_checked": 0, "min_rel_gap": None, "near_ties": [], "exact_ties": [],
                      "near_ties_format": "[layer, position, relative gap]"}}
    g = gnz = math.inf
    for li, ratio, k, sc in diag.indexer:
        S = sc.shape[0]
        for t in range(S):
            vis = (t + 1) // ratio
            if vis <= k:
                continue
            v = torch.sort(sc[t, :vis].double(), descending=True).values
            a, b = v[k - 1].item(), v[k].item()
            rep["indexer"]["boundaries_checked"] += 1
            gg = gap(a, b)
            g = min(g, gg)
            if gg > 0:
                gnz = min(gnz, gg)
            if a == b:
                rep["indexer"]["exact_ties"].append([li, t, a])
            if gg < NEAR_TIE:
                rep["indexer"]["near_ties"].append([li, t, gg, a, b])
    rep["indexer"]["min_rel_gap"] = None if g == math.inf else g
    rep["indexer"]["min_rel_gap_excluding_exact_ties"] = None if gnz == math.inf else gnz
    g = math.inf
    for li, k, s in diag.router:
        v = torch.sort(s.double(), dim=-1, descending=True).values
        for t in range(v.shape[0]):
            a, b = v[t, k - 1].item(), v[t, k].item()
            rep["router"]["boundaries_checked"] += 1
            gg = gap(a, b)
            g = min(g, gg)
            if a == b:
                rep["router"]["exact_ties"].append([li, t, a])
            if gg < NEAR_TIE:
                rep["router"]["near_ties"].append([li, t, gg])
    rep["router"]["min_rel_gap"] = None if g == math.inf else g
    return rep


def site_report(diag):
    out = {}
    for name, st in sorted(diag.sites.items()):
        st = dict(st)
        for k in ("min_mid_gap", "min_scale_gap"):
            st[k] = None if st[k] == math.inf else st[k]
        out[name] = st
    return out


def dumps(o, ind=0):
    """JSON with dicts one key a line and lists of scalars (or of short lists) on one line."""
    pad = " " * ind
    if isinstance(o, dict):
        if not o:
            return "{}"
        items = [f'{pad} {json.dumps(k)}: {dumps(v, ind + 1)}' for k, v in o.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(o, list):
        flat = json.dumps(o)
        if all(not isinstance(x, (dict, list)) for x in o) or (len(flat) <= 100 and "{" not in flat):
            return flat
        return "[\n" + ",\n".join(pad + " " + dumps(x, ind + 1) for x in o) + "\n" + pad + "]"
    return json.dumps(o)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_ref(d):
    with open(os.path.join(d, "ref.json")) as f:
        ref = json.load(f)
    V = ref["vocab_size"]
    raw = torch.frombuffer(bytearray(open(os.path.join(d, ref.get("logits_file", "ref_logits.f32")), "rb").read()),
                           dtype=torch.float32)
    return ref, raw.view(-1, V)


def dedupe(recs):
    """[site, layer, row, head, channel, gap] records without repeats (a tensor two GEMMs take, such as the
    attention's x for wq_a and wkv, is quantised once and recorded by both)."""
    seen, out = set(), []
    for r in recs:
        k = tuple(r[:5])
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out


ENGINE_TOL = 1e-4       # what the engine-guided search calls agreement (the test's REL_TOL)
ENGINE_MAX_FLIPS = 48


def engine_logits(engine, d, ids, threads):
    """The engine's official-semantics logits for the fixture in d, [S, V] float32."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as td:
        out = os.path.join(td, "l.f32")
        p = subprocess.run([engine, "logits", "--model", d, "--input-ids", ",".join(map(str, ids)), "--out-f32", out,
                            "--threads", str(threads), "--semantics", "official", "--json"],
                           capture_output=True, text=True, timeout=1200)
        if p.returncode:
            raise RuntimeError(f"{engine} logits: {p.stderr.strip()}")
        raw = torch.frombuffer(bytearray(open(out, "rb").read()), dtype=torch.float32)
    return raw.view(len(ids), -1)


def first_over(rr, tol):
    return next((t for t, e in enumerate(rr) if e > tol), None)


def explain_engine(model, ids, eng):
    """Which near-midpoint elements the engine rounds the other way.  Greedy, in position order: at the first
    position where the engine and the oracle (with the flips found so far forced) differ by more than
    ENGINE_TOL, try each element within NEAR_MID of a rounding midpoint at that token (then at earlier ones) and
    keep the one that moves the first difference furthest.  Returns (forced [site, layer, row, head, channel,
    gap], the oracle's logits with them forced, a log of the steps)."""
    forced, steps = [], []
    cur, _, dg = forward(model, ids, on=set(PATCHES), diag=True)
    p = first_over(rel_rows(eng, cur), ENGINE_TOL)
    while p is not None and len(forced) < ENGINE_MAX_FLIPS:
        have = {tuple(f[:5]) for f in forced}
        near = [r for r in dedupe(dg.near) if tuple(r[:5]) not in have and r[2] <= p]
        near.sort(key=lambda r: (r[2] != p, -r[2], r[5]))   # this token first, then the nearest earlier ones
        best = None
        for r in near[:24]:
            lg, _, _ = forward(model, ids, on=set(PATCHES), force=[f[:5] for f in forced] + [r[:5]])
            q = first_over(rel_rows(eng, lg), ENGINE_TOL)
            q = len(ids) if q is None else q
            if q > p and (best is None or q > best[0]):
                best = (q, r, lg)
        if best is None:
            steps.append({"position": p, "explained": False, "tried": len(near[:24])})
            break
        forced.append(best[1])
        steps.append({"position": p, "explained": True, "flip": best[1], "next_difference": best[0]})
        cur, _, dg = forward(model, ids, on=set(PATCHES), diag=True, force=[f[:5] for f in forced])
        p = first_over(rel_rows(eng, cur), ENGINE_TOL)
    return forced, cur, steps


def make(name, threads, engine=None):
    d = os.path.join(FIXTURE_ROOT, name)
    md = os.path.join(FIXTURE_ROOT, MODEL_DIR.get(name, name))
    ref, ref_logits = load_ref(md)
    ids = ref["input_ids"]
    model = load(md)
    cfg = model.config
    roles = quantised_roles(d)

    # 0. transformers untouched, then the wrappers with every switch off: the same bits
    uninstall()
    with torch.no_grad():
        plain = model(torch.tensor([ids]), use_cache=False).logits[0].float()
    install(model, roles)
    off, calls_off, _ = forward(model, ids, on=())
    checks = {
        "patches_off_equal_transformers_bitwise": bool(torch.equal(off, plain)),
        "transformers_vs_fixture_ref_logits_max_abs": float((plain - ref_logits).abs().max())
        if plain.shape == ref_logits.shape else None,
        "transformers_vs_fixture_ref_logits_bitwise": bool(torch.equal(plain, ref_logits))
        if plain.shape == ref_logits.shape else None,
    }
    assert checks["patches_off_equal_transformers_bitwise"], "wrappers not transparent with every switch off"
    assert not any(calls_off.values()), calls_off

    # 1. each switch alone is live
    alone = {}
    for p in PATCHES:
        lg, calls, _ = forward(model, ids, on={p})
        layers_hit = calls[p]
        r = rel_rows(lg, plain)
        alone[p] = {"calls": layers_hit, "max_rel_change_vs_transformers": max(r),
                    "bitwise_equal_to_transformers": bool(torch.equal(lg, plain))}
    checks["each_patch_alone"] = alone

    # 2. the official forward, with diagnostics
    logits, calls, diag = forward(model, ids, on=set(PATCHES), diag=True)
    again, _, _ = forward(model, ids, on=set(PATCHES))
    checks["deterministic"] = bool(torch.equal(logits, again))
    checks["calls"] = calls
    r = rel_rows(logits, plain)
    # the same with torch.topk's own order among equal indexer scores
    torch_ties, _, _ = forward(model, ids, on=set(PATCHES) - {"indexer_ties_lower_index"})
    rt = rel_rows(torch_ties, logits)
    tie_effect = {
        "rows_where_torch_topk_and_lower_index_differ": diag.tie_rows,
        "rows_format": "[layer, position]; only rows whose VISIBLE picks differ (masked -inf picks are dropped "
                       "by attention anyway)",
        "max_rel_logits_change_if_torch_topk_order": max(rt),
        "positions_changed_over_1e-6": ranges([t for t, e in enumerate(rt) if e > 1e-6]),
    }
    S, V = logits.shape
    logits.contiguous().numpy().astype("<f4").tofile(os.path.join(d, "ref_official_logits.f32"))

    # flip experiments: every element / block near a rounding boundary made to round the other way,
    # every top-k boundary with a relative gap below NEAR_MID taken the other way
    tk = topk_report(diag, cfg)
    fields = ("site", "layer", "row", "head", "channel", "gap")
    cands = [dict(zip(fields, rec), kind="element") for rec in dedupe(diag.near)]
    cands += [dict(zip(fields, rec), kind="scale") for rec in dedupe(diag.near_scale)]
    for which in ("indexer", "router"):
        for nt in tk[which]["near_ties"]:
            if nt[2] < NEAR_MID and nt[2] > 0:
                cands.append({"site": which + "_topk", "layer": nt[0], "row": nt[1], "gap": nt[2], "kind": "swap"})
    flips = []
    for c in cands:
        key = [c["site"], c["layer"], c["row"], c.get("head"), c.get("channel")]
        kw = {"element": {"force": [key]}, "scale": {"force_scale": [key]}, "swap": {"swap": [key[:3]]}}[c["kind"]]
        lg, _, _ = forward(model, ids, on=set(PATCHES), **kw)
        rr = rel_rows(lg, logits)
        c.update(max_rel_change=max(rr), positions_over_1e4=ranges([t for t, e in enumerate(rr) if e > 1e-4]),
                 first_changed=next((t for t, e in enumerate(rr) if e > 0), None))
        flips.append(c)
    flip_max = max((f["max_rel_change"] for f in flips), default=0.0)
    print(f"   flip experiments: {len(flips)} candidates, worst max rel change {flip_max:.3g}, "
          f"{sum(1 for f in flips if f['positions_over_1e4'])} move some position by > 1e-4")

    eng_out = None
    if name in MODEL_DIR and engine:
        eng = engine_logits(engine, d, ids, threads)
        forced, flipped, steps = explain_engine(model, ids, eng)
        rr = rel_rows(eng, flipped)
        flipped.contiguous().numpy().astype("<f4").tofile(os.path.join(d, "ref_official_flipped_logits.f32"))
        eng_out = {
            "about": "the engine rounds some quantiser inputs that lie within NEAR_MID of a rounding midpoint the "
                     "other way (its fp32 sums are ordered differently from torch's).  Found greedily in position "
                     "order (explain_engine); the oracle with exactly these elements forced the other way is "
                     "ref_official_flipped_logits.f32.  Each entry: [site, layer, token, head, channel, relative "
                     "gap of x/scale to the midpoint]",
            "engine": os.path.relpath(engine, ROOT),
            "forced": forced,
            "steps": steps,
            "logits_file": "ref_official_flipped_logits.f32",
            "engine_vs_flipped_max_rel": max(rr),
            "engine_vs_flipped_positions_over_tol": ranges([t for t, e in enumerate(rr) if e > ENGINE_TOL]),
            "engine_vs_plain_oracle_first_over_tol": first_over(rel_rows(eng, logits), ENGINE_TOL),
        }
        print(f"   engine: {len(forced)} flips forced, engine vs flipped oracle max rel {max(rr):.3g}, "
              f"{sum(1 for e in rr if e > ENGINE_TOL)} positions over {ENGINE_TOL}; unexplained steps "
              f"{sum(1 for st in steps if not st['explained'])}")

    diag_out = {
        "near_midpoint_rel": NEAR_MID,
        "quantised_sites": site_report(diag),
        "near_midpoint_elements_format": "[site, layer, row (token or entry), head, channel in the quantised span, "
                                         "relative distance of x/scale to the nearest rounding midpoint]",
        "near_midpoint_elements": diag.near,
        "near_scale_boundary_blocks_format": "[site, layer, row, head, first channel of the block, relative distance "
                                             "of amax*fl32(1/max) to the nearest power of two]",
        "near_scale_boundary_blocks": diag.near_scale,
        "flip_experiments_about": "one official forward per candidate, with only that element (kind element) or "
                                  "block scale (kind scale) rounded the other way, or that top-k boundary taken the "
                                  "other way (kind swap: the (k+1)-th replaces the k-th); max_rel_change and "
                                  "positions_over_1e4 (inclusive [first, last] ranges) are per-position "
                                  "max|diff|/max|ref| against ref_official_logits.f32",
        "flip_experiments": flips,
        "flip_experiments_worst_max_rel": flip_max,
        "topk": tk,
        "indexer_tie_order": tie_effect,
    }
    out = {
        "fixture": name,
        "semantics": "official (oracle: transformers + the official round trips and router/expert arithmetic)",
        "generator": "tools/make_official_ref.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": threads,
        "load": "DeepseekV4ForCausalLM.from_pretrained(dir, dtype=float32, attn_implementation='eager')",
        "model_dir": os.path.basename(md),
        "act_quant_gemms": {"linear": sorted([li, name, site] for li, _, site, name in roles[0]),
                            "experts": {str(li): {"w1_w3": len(i), "w2": len(o)}
                                        for li, (i, o) in sorted(roles[1].items())}},
        "experts_implementation": getattr(cfg, "_experts_implementation", None),
        "forward": "one full forward, use_cache=False, over ref.json input_ids",
        "input_ids_from": "ref.json",
        "checkpoint_sha256": {f: sha256(os.path.join(d, f)) for f in sorted(os.listdir(d))
                              if f.endswith(".safetensors") or f in ("config.json", "ref.json")},
        "logits_file": "ref_official_logits.f32",
        "logits_dtype": "float32-le",
        "logits_shape": [S, V],
        "argmax": logits.argmax(-1).tolist(),
        "patches": {p: PATCH_DOC[p] for p in PATCHES},
        "quantiser": {
            "fp8": "clamp(x/s, +-448) -> torch float8_e4m3fn cast (RNE) -> *s; "
                   "s = 2^ceil(log2(max(amax,1e-4)*fl32(1/448)))",
            "fp4": "clamp(x/s, +-6) -> nearest e2m1 (ties to even mantissa) -> *s; "
                   "s = 2^ceil(log2(max(amax,6*2^-126)*fl32(1/6)))",
            "hadamard": "x @ H_n (Sylvester, H_2k = [[H,H],[H,-H]]) * n^-1/2, float32 matmul",
            "fp8_block": FP8_BLOCK, "fp4_block": FP4_BLOCK, "act_block": ACT_BLOCK,
            "partial_block": "a trailing short block is its own block (none in these fixtures)",
        },
        "checks": checks,
        "official_vs_transformers_max_rel_per_position": {"max": max(r), "mean": sum(r) / len(r)},
        "diagnostics": diag_out,
    }
    if eng_out is not None:
        out["engine_flips"] = eng_out
    with open(os.path.join(d, "ref_official.json"), "w") as f:
        f.write(dumps(out) + "\n")
    with open(os.path.join(d, "ref_official.json")) as f:
        assert json.load(f) == json.loads(json.dumps(out))
    sites = diag_out["quantised_sites"]
    print(f"[{name}] S={S} V={V} off==transformers {checks['patches_off_equal_transformers_bitwise']} "
          f"(fixture ref max abs {checks['transformers_vs_fixture_ref_logits_max_abs']}); official vs transformers "
          f"max rel {max(r):.3g}")
    for p, a in alone.items():
        print(f"   {p:26s} calls {a['calls']:4d}  max rel change {a['max_rel_change_vs_transformers']:.3g}")
    for s, st in sites.items():
        print(f"   {s:14s} elems {st['elements']:8d} blocks {st['blocks']:7d} near-mid {st['near_midpoint']:4d} "
              f"(min gap {st['min_mid_gap']:.2e}) scale-near-pow2 {st['scale_near_pow2']} "
              f"(min {st['min_scale_gap']:.2e}) div!=mul {st['scale_div_vs_mul_differs']}")
    print(f"   indexer top-k: {tk['indexer']['boundaries_checked']} boundaries, "
          f"min rel gap {tk['indexer']['min_rel_gap']}, "
          f"near ties {len(tk['indexer']['near_ties'])}, exact ties {len(tk['indexer']['exact_ties'])}")
    print(f"   torch.topk vs lower-index tie order differ at {diag.tie_rows}; using torch's order changes logits by "
          f"max rel {max(rt):.3g} at {sum(1 for e in rt if e > 1e-6)} positions")
    print(f"   router top-k: {tk['router']['boundaries_checked']} boundaries, "
          f"min rel gap {tk['router']['min_rel_gap']}, "
          f"near ties {len(tk['router']['near_ties'])}, exact ties {len(tk['router']['exact_ties'])}")
    return out


# --------------------------------------------------------------------------------------------
# self-test of the quantisers against brute force on the format grids
# --------------------------------------------------------------------------------------------

def _grid_e4m3():
    vals = set()
    for e in range(1, 16):
        for m in range(8):
            vals.add((1 + m / 8) * 2.0 ** (e - 7))
    for m in range(8):
        vals.add(m / 8 * 2.0 ** -6)
    vals.discard(480.0)   # 0x7F is NaN in e4m3fn: max 448
    g = sorted(v for v in vals if v <= 448)
    return torch.tensor(g, dtype=torch.float64)


def _brute(v, grid, even):
    a = v.abs().double()
    d = (a.unsqueeze(-1) - grid).abs()
    best = d.min(-1).values
    cand = (d == best.unsqueeze(-1))
    # ties: even code index (grid index parity = mantissa parity on these grids)
    idx = torch.where(cand.sum(-1) > 1, (cand & even).float().argmax(-1), d.argmin(-1))
    return torch.copysign(grid[idx].float(), v)


def selftest():
    g8 = _grid_e4m3()
    even8 = (torch.arange(len(g8)) % 2 == 0)
    g4 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float64)
    even4 = (torch.arange(8) % 2 == 0)
    gen = torch.Generator().manual_seed(0)
    mids8 = ((g8[1:] + g8[:-1]) / 2).float()
    sign = torch.randint(0, 2, (100000,), generator=gen) * 2 - 1
    v8 = torch.cat([(torch.rand(200000, generator=gen) * 2 - 1) * 448,
                    torch.exp(torch.rand(100000, generator=gen) * 16 - 12) * sign,
                    mids8, -mids8, g8.float(), torch.nextafter(mids8, torch.zeros_like(mids8)),
                    torch.nextafter(mids8, torch.full_like(mids8, 1e9))]).clamp(-448, 448)
    assert torch.equal(e4m3_round(v8), _brute(v8, g8, even8)), "e4m3 rounding"
    mids4 = ((g4[1:] + g4[:-1]) / 2).float()
    v4 = torch.cat([(torch.rand(200000, generator=gen) * 2 - 1) * 6, mids4, -mids4, g4.float(),
                    torch.nextafter(mids4, torch.zeros_like(mids4)), torch.nextafter(mids4, torch.full_like(mids4, 9))])
    assert torch.equal(e2m1_round(v4), _brute(v4, g4, even4)), "e2m1 rounding"
    x = torch.tensor([1.0, 0.5, 3.0, 14.0, 2.0 ** -100 * 1.5])
    assert pow2_ceil(x).tolist() == [1.0, 0.5, 4.0, 16.0, 2.0 ** -99], pow2_ceil(x)
    h = hadamard(torch.eye(8))
    assert torch.allclose(h @ h.T, torch.eye(8), atol=1e-6)
    # a trailing short block is its own block
    y = fq(torch.tensor([[[100.0] + [1.0] * 63 + [0.3, 0.01]]]), 64, "e4m3")
    assert y[0, 0, 64].item() == e4m3_round(torch.tensor(0.3 / 2 ** -10)).item() * 2 ** -10
    print("selftest ok: e4m3 / e2m1 rounding vs brute force, pow2_ceil, Hadamard, partial block")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append",
                    help="fixture name (repeatable); default: " + ", ".join(DEFAULT_FIXTURES))
    ap.add_argument("--threads", type=int, default=max(1, min(8, os.cpu_count() or 1)))
    ap.add_argument("--selftest", action="store_true", help="only check the quantisers")
    ap.add_argument("--engine", default=os.path.join(ROOT, "build", "deepinfer"),
                    help="engine binary for the quantised fixtures' flip search (default build/deepinfer)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    selftest()
    if args.selftest:
        return 0
    for n in args.only or DEFAULT_FIXTURES:
        make(n, args.threads, args.engine if os.path.exists(args.engine) else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
