#!/usr/bin/env python3
"""Quantize a bf16 V4 fixture the way the V4-Flash release stores its weights, and write its
dequantized dense twin with a transformers reference.

Usage:
    python tools/quantize_v4_fixture.py [--src tests/fixtures/model/tiny-mixed]
        [--out tests/fixtures/model/tiny-mixed-fp8fp4] [--twin tests/fixtures/model/tiny-mixed-fp8fp4-twin]
        [--block 32] [--device cpu|cuda]

(a) OUT: the quantized checkpoint (spec model-v4.md §5.3, §5.4, §6.1):
  * FP8 E4M3 weight + F8_E8M0 (ue8m0) block scale `NAME.scale` [ceil(out/bs), ceil(in/bs)] for
    attention wq_a, wq_b, wkv, wo_a, wo_b, indexer wq_b and shared experts w1/w2/w3;
  * routed experts w1/w2/w3 as FP4 E2M1 packed two per byte (low nibble = even element) in an I8
    tensor [out, in/2] + F8_E8M0 scale [out, in/32] under the official per-expert names
    `model.layers.L.ffn.experts.E.w{1,2,3}.weight` / `.scale` (a fused transformers layout
    `experts.gate_up_proj` / `experts.down_proj` is split into these names);
  * every other tensor unchanged (same name, dtype, bytes);
  * config.json = the source config + quantization_config {fp8, e4m3, ue8m0, [bs, bs], dynamic}
    + expert_dtype "fp4".
(b) TWIN: a dense checkpoint with exactly the source layout (names, dtypes, shards) whose quantized
    weights are replaced by their dequantized values (exact in bf16, asserted), plus ref.json /
    ref_logits.f32 from transformers (tools/make_v4_fixtures.py reference_forward).

Scale rule -- followed from DeepSeek's V4 inference/kernel.py (the release's TileLang kernels; copy
read at github.com/Mockingjay1316/deepseek-v4-flash-spark inference/kernel.py @1795ef7):
  fast_round_scale(amax, max_inv) = fast_pow2(fast_log2_ceil(amax * max_inv)), i.e.
      2^ceil(log2(fp32(amax * fp32(1/max))))  computed on the fp32 bits: exponent field - 127,
      plus 1 when any mantissa bit is set;
  FP8 (act_quant_kernel, round_scale=True): amax = max(|x| over the block, 1e-4), max = 448,
      q = e4m3(clamp(x / s, -448, 448)) (cast = round to nearest even);
  FP4 (fp4_quant_kernel): amax = max(|x| over 32 inputs, 6 * 2^-126), max = 6,
      q = e2m1(clamp(x / s, -6, 6)) (round to nearest, ties to even code).
The release's weights were produced by DeepSeek's own (unpublished) quantizer; the official
inference/convert.py only re-packs already-quantized tensors (FP4 view / lossless
cast_e2m1fn_to_e4m3fn, wo_a dequant), which is where the packing convention comes from:
`torch.stack([FP4_TABLE[x & 0x0F], FP4_TABLE[x >> 4]], -1).flatten` -> element 2i = low nibble.
We apply the kernel rule to bs x bs weight blocks (FP8) and 1 x 32 blocks (FP4).
"""
import argparse
import json
import os
import re
import shutil
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_v4_fixtures as mk  # noqa: E402

ROOT = mk.ROOT
FIX = os.path.join(ROOT, "tests", "fixtures", "model")

FP4_TABLE = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                          -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float32)

# FP8 block-quantized linears (official names, after an optional `model.` prefix).
FP8_RE = re.compile(r"^(model\.)?layers\.\d+\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b)|attn\.indexer\.wq_b|"
                    r"ffn\.shared_experts\.(w1|w2|w3))\.weight$")
EXPERT_RE = re.compile(r"^(model\.)?layers\.\d+\.ffn\.experts\.\d+\.(w1|w2|w3)\.weight$")
FUSED_RE = re.compile(r"^((model\.)?layers\.\d+\.ffn\.experts)\.(gate_up_proj|down_proj)$")


def fast_round_scale(amax, max_inv):
    """kernel.py fast_round_scale: 2^ceil(log2(amax * max_inv)) on the fp32 bits. Returns
    (scale fp32, ue8m0 byte)."""
    p = (amax.float() * torch.tensor(max_inv, dtype=torch.float32)).contiguous()
    bits = p.view(torch.int32)
    exp = (bits >> 23) & 0xFF
    man = bits & 0x7FFFFF
    e = exp - 127 + (man != 0).to(torch.int32)      # fast_log2_ceil
    byte = (e + 127).to(torch.int32)
    assert int(byte.min()) >= 1 and int(byte.max()) <= 254, "scale out of ue8m0 range"
    scale = torch.ldexp(torch.ones_like(p), e)       # fast_pow2
    return scale, byte.to(torch.uint8)


def quant_fp8_block(w, bs):
    """w [out, in] -> (e4m3 [out, in], ue8m0 scale bytes [ceil(out/bs), ceil(in/bs)], dequant fp32)."""
    out, inn = w.shape
    ob, ib = -(-out // bs), -(-inn // bs)
    x = w.float()
    xp = torch.zeros(ob * bs, ib * bs)
    xp[:out, :inn] = x
    blocks = xp.view(ob, bs, ib, bs).abs().amax(dim=(1, 3))
    amax = blocks.clamp_min(1e-4)
    s, byte = fast_round_scale(amax, 1.0 / 448.0)
    sfull = s.repeat_interleave(bs, 0).repeat_interleave(bs, 1)[:out, :inn]
    q = (x / sfull).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    deq = q.float() * sfull
    return q, byte, deq


def round_e2m1(v):
    """fp32 values already in [-6, 6] -> 4-bit codes, nearest grid value, ties to the even code."""
    a = v.abs()
    grid = FP4_TABLE[:8]
    d = (a.unsqueeze(-1) - grid).abs()                     # [..., 8]
    dmin = d.min(-1, keepdim=True).values
    cand = d == dmin
    even = cand & (torch.arange(8) % 2 == 0)
    pick = torch.where(even.any(-1, keepdim=True), even, cand).to(torch.int64).argmax(-1)
    sign = torch.signbit(v).to(torch.int64)
    return (pick | (sign << 3)).to(torch.uint8)


def quant_fp4(w):
    """w [out, in] -> (packed int8 [out, in/2], ue8m0 bytes [out, in/32], dequant fp32)."""
    out, inn = w.shape
    assert inn % 32 == 0, "FP4 needs in % 32 == 0"
    x = w.float().view(out, inn // 32, 32)
    amax = x.abs().amax(-1).clamp_min(6 * 2.0 ** -126)
    s, byte = fast_round_scale(amax, 1.0 / 6.0)
    q = (x / s.unsqueeze(-1)).clamp(-6.0, 6.0)
    codes = round_e2m1(q).view(out, inn)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    deq = (FP4_TABLE[codes.long()].view(out, inn // 32, 32) * s.unsqueeze(-1)).view(out, inn)
    return packed, byte, deq


def unpack_fp4(packed, byte):
    """Independent decoder used as a self-check (spec §5.4)."""
    u = packed.view(torch.uint8)
    vals = torch.stack([FP4_TABLE[(u & 0x0F).long()], FP4_TABLE[(u >> 4).long()]], -1).flatten(1)
    sc = torch.ldexp(torch.ones(byte.shape), byte.to(torch.int32) - 127)
    return vals * sc.repeat_interleave(32, 1)


def exact_bf16(deq, what):
    b = deq.to(torch.bfloat16)
    if not torch.equal(b.float(), deq):
        raise RuntimeError(f"{what}: dequantized value not exact in bf16")
    return b


def load_dir(src):
    with open(os.path.join(src, "model.safetensors.index.json")) as f:
        index = json.load(f)
    tensors, order = {}, {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(os.path.join(src, shard), "pt") as g:
            order[shard] = list(g.keys())
            for k in g.keys():
                tensors[k] = g.get_tensor(k)
    return index, tensors, order


def write_sharded(dst, groups, metadata_extra=None):
    """groups: list of dict name->tensor, one per shard."""
    n = len(groups)
    weight_map, total = {}, 0
    for i, grp in enumerate(groups):
        fn = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file({k: v.contiguous() for k, v in grp.items()}, os.path.join(dst, fn), metadata={"format": "pt"})
        for k, v in grp.items():
            weight_map[k] = fn
            total += v.numel() * v.element_size()
    meta = {"total_size": total}
    meta.update(metadata_extra or {})
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": meta, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=os.path.join(FIX, "tiny-mixed"))
    ap.add_argument("--out", default=os.path.join(FIX, "tiny-mixed-fp8fp4"))
    ap.add_argument("--twin", default=os.path.join(FIX, "tiny-mixed-fp8fp4-twin"))
    ap.add_argument("--block", type=int, default=32, help="FP8 weight block size (V4-Flash: 128)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    bs = args.block
    torch.backends.cuda.matmul.allow_tf32 = False

    index, tensors, order = load_dir(args.src)
    with open(os.path.join(args.src, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(args.src, "ref.json")) as f:
        src_ref = json.load(f)

    q_groups, twin_groups = [], []
    counts = {"fp8": 0, "fp4": 0, "kept": 0}
    for shard in sorted(order):
        qg, tg = {}, {}
        for k in order[shard]:
            t = tensors[k]
            fused = FUSED_RE.match(k)
            if FP8_RE.match(k):
                q, byte, deq = quant_fp8_block(t, bs)
                qg[k] = q
                qg[k[: -len(".weight")] + ".scale"] = byte.view(torch.float8_e8m0fnu)
                tg[k] = exact_bf16(deq, k).to(t.dtype)
                counts["fp8"] += 1
            elif EXPERT_RE.match(k):
                packed, byte, deq = quant_fp4(t)
                assert torch.equal(unpack_fp4(packed, byte), deq), k
                qg[k] = packed
                qg[k[: -len(".weight")] + ".scale"] = byte.view(torch.float8_e8m0fnu)
                tg[k] = exact_bf16(deq, k).to(t.dtype)
                counts["fp4"] += 1
            elif fused:
                # transformers fused layout [E, 2I, D] (gate rows, then up) / [E, D, I] -> official names
                base, kind = fused.group(1), fused.group(3)
                deqs = []
                for e in range(t.shape[0]):
                    if kind == "gate_up_proj":
                        I = t.shape[1] // 2
                        parts = {"w1": t[e, :I], "w3": t[e, I:]}
                    else:
                        parts = {"w2": t[e]}
                    row = {}
                    for w, m in parts.items():
                        packed, byte, deq = quant_fp4(m)
                        qg[f"{base}.{e}.{w}.weight"] = packed
                        qg[f"{base}.{e}.{w}.scale"] = byte.view(torch.float8_e8m0fnu)
                        row[w] = exact_bf16(deq, f"{k}[{e}].{w}")
                        counts["fp4"] += 1
                    deqs.append(torch.cat([row["w1"], row["w3"]], 0) if kind == "gate_up_proj" else row["w2"])
                tg[k] = torch.stack(deqs).to(t.dtype)
            else:
                qg[k] = t
                tg[k] = t
                counts["kept"] += 1
        q_groups.append(qg)
        twin_groups.append(tg)

    # (a) quantized checkpoint
    for d in (args.out, args.twin):
        if os.path.exists(d):
            shutil.rmtree(d)
        os.makedirs(d)
    write_sharded(args.out, q_groups)
    qcfg = dict(cfg)
    qcfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                   "weight_block_size": [bs, bs], "activation_scheme": "dynamic"}
    qcfg["expert_dtype"] = "fp4"
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(dict(sorted(qcfg.items())), f, indent=2)
        f.write("\n")

    # (b) dequantized twin: same layout as the source, same config
    write_sharded(args.twin, twin_groups)
    shutil.copy(os.path.join(args.src, "config.json"), os.path.join(args.twin, "config.json"))
    ids = src_ref["input_ids"]
    logits, report = mk.reference_forward(args.twin, ids, torch.device(args.device))
    nt = len(report["indexer_ties"]) + len(report["router_ties"])
    twin_name = os.path.basename(os.path.normpath(args.twin))
    out_name = os.path.basename(os.path.normpath(args.out))
    ref = mk.write_ref(args.twin, twin_name, ids, logits, report, {
        "device": args.device,
        "source_fixture": src_ref["fixture"], "source_seed": src_ref.get("seed"),
        "quantized_twin_of": out_name,
        "notes": f"dense bf16 twin of {out_name}: the tensors of {src_ref['fixture']} with every "
                 f"FP8 (block {bs}x{bs}) / FP4 (1x32) weight replaced by its exact dequantized value; "
                 f"its logits are the unquantized-math reference for {out_name} (transformers has no "
                 f"activation quantization, so an engine running {out_name} with FP8 activation "
                 f"quant will deviate by that quantization only).",
        "layer_types": src_ref.get("layer_types"), "mlp_layer_types": src_ref.get("mlp_layer_types"),
    })
    with open(os.path.join(args.out, "ref.json"), "w") as f:
        json.dump({"fixture": out_name, "reference": f"../{twin_name}/ref.json",
                   "notes": "no logits here: the dequantized twin holds the reference (same input_ids)",
                   "source_fixture": src_ref["fixture"], "block": bs,
                   "scale_rule": "kernel.py fast_round_scale: 2^ceil(log2(fp32(amax*fp32(1/max)))); "
                                 "fp8 amax floor 1e-4, max 448; fp4 amax floor 6*2^-126, max 6; RNE casts",
                   "tensor_counts": counts}, f, indent=1)
        f.write("\n")
    d0 = (logits - torch.tensor(0.0)).std().item()
    srcl = torch.frombuffer(bytearray(open(os.path.join(args.src, "ref_logits.f32"), "rb").read()),
                            dtype=torch.float32).view(logits.shape)
    print(f"quantized: {counts}; twin logits std {d0:.3f}; ties {nt}; "
          f"max |twin - src| logits {float((logits - srcl).abs().max()):.4f}, top-1 agreement "
          f"{float((logits.argmax(-1) == srcl.argmax(-1)).float().mean()):.4f}")
    for d in (args.out, args.twin):
        print(f"  {os.path.basename(d):32s} {mk.dir_size(d) / 1e6:7.2f} MB")
    return 0 if nt == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
