"""The CPU model's `--semantics official` against an independent oracle.

Reference: tests/fixtures/model/<fixture>/ref_official_logits.f32 (+ ref_official.json), written
by tools/make_official_ref.py: transformers 5.17 DeepseekV4ForCausalLM (float32, eager, one full
forward without cache, every position) with what DeepSeek's inference/model.py + kernel.py do and
transformers does not, patched in from the math (docs/MODEL-OFFICIAL-ORACLE.md): FP8 e4m3 round
trip of the window KV and of the main compressors' entries, Hadamard + FP4 e2m1 round trip of the
indexer keys and queries, router weights s / sum(s), routing weight applied before w2; among EQUAL
indexer scores the lower entry index is kept (the engine's documented rule; both references leave
tie order to torch.topk, and tiny-mixed has one exact tie, layer 1 position 223, at score 0).

Acceptance, for tiny-mixed, tiny-hash-swa and tiny-hca16:
  * every position within REL_TOL = 1e-4 max relative error (max |ours - ref| / max |ref| over
    the vocabulary), as in the transformers test (test_model_ref.py), except boundary flips:
  * a boundary flip is a quantiser input that our fp32 arithmetic and torch's put on opposite
    sides of a rounding midpoint (one element one FP8/FP4 step apart).  ref_official.json lists
    every element within 1e-5 relative of a midpoint ("near_midpoint_elements": 36 FP8 and 49 FP4
    candidates in tiny-mixed) and, for each, a "flip experiment": the oracle re-run with only that
    element rounded the other way, the positions it moves by > 1e-4 and by how much.  Allowed per
    fixture: at most MAX_FLIP_POSITIONS = 4 positions above REL_TOL, each at most FLIP_TOL = 1e-3,
    and each one that some flip experiment with an effect of at most FLIP_TOL moves by > 1e-4;
  * top-1 equal at every position within REL_TOL (positions without flips).

Measured (engine built from the tree at c66d2ff, src/model/ as of 470948a; --threads 1/2/4 give
the same bits): tiny-hash-swa 9.5e-7, tiny-hca16 4.1e-6, tiny-mixed 1.7e-4 -- 518 positions
<= 1e-4 and two flip positions, 242 (1.14e-4) and 378 (1.68e-4).  They are two window-KV
elements: layer 2 token 231 channel 19 (gap 2.4e-6) and layer 4 token 370 channel 45 (gap
9.3e-6); their flip experiments move exactly these positions by exactly these amounts, and the
oracle with both flips forced agrees with the engine to 2.9e-6 at every position.  The bound of
4 positions / 1e-3 is twice / six times what is seen.

Why not 1e-4 everywhere: which candidates flip depends on the last bits of the fp32 arithmetic,
and some flips cascade (the FP8 round trips downstream requantise the perturbation, and router /
indexer choices near a tie follow it): single flips in the experiments move logits by up to 0.46.
If a future engine build fails here at positions covered by such an experiment, that is a flip,
not necessarily a semantic bug: the failure message lists the experiments that cover the first
bad position (rerun tools/make_official_ref.py to refresh them).

The checker must reject wrong semantics: test_oracle_rejects_transformers_semantics runs the
engine with --semantics transformers and requires the same checks to fail.
"""
import array
import json
import os
import subprocess
import sys
import tempfile

import pytest

from model_fixtures import fixture_dir

FIXTURES = ["tiny-mixed", "tiny-hash-swa", "tiny-hca16", "tiny-mixed-fp8fp4"]
QUANTISED = {"tiny-mixed-fp8fp4"}  # FP8 / FP4 weights: the GEMM activation quantisation (point 8) is live
REL_TOL = 1e-4
FLIP_TOL = 1e-3
MAX_FLIP_POSITIONS = 4


def load_oracle(fixture):
    d = fixture_dir(fixture)
    with open(d / "ref.json", encoding="utf-8") as f:
        ref = json.load(f)
    if "reference" in ref:  # a quantised fixture: its dequantised twin holds input_ids and vocab_size
        with open(d / ref["reference"], encoding="utf-8") as f:
            ref = json.load(f)
    with open(d / "ref_official.json", encoding="utf-8") as f:
        orc = json.load(f)
    S, V = orc["logits_shape"]
    flat = array.array("f")
    with open(d / orc["logits_file"], "rb") as f:
        flat.frombytes(f.read())
    if sys.byteorder != "little":
        flat.byteswap()
    assert len(flat) == S * V, f"{fixture}: {len(flat)} floats, expected {S}x{V}"
    return ref, orc, [flat[i * V:(i + 1) * V] for i in range(S)]


def run_logits(deepinfer, fixture, ids, semantics):
    with tempfile.TemporaryDirectory() as td:
        out = os.path.join(td, "l.f32")
        p = subprocess.run(
            [deepinfer, "logits", "--model", str(fixture_dir(fixture)), "--input-ids", ",".join(map(str, ids)),
             "--json", "--out-f32", out, "--threads", "2", "--semantics", semantics],
            capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        a = array.array("f")
        with open(out, "rb") as f:
            a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return a


def rel_err(ours, ref):
    return max(abs(x - y) for x, y in zip(ours, ref)) / max(abs(x) for x in ref)


def top1(row):
    return max(range(len(row)), key=lambda i: (row[i], -i))


def flip_cover(orc):
    """position -> flip experiments (effect <= FLIP_TOL) that move it by > 1e-4."""
    cover = {}
    for e in orc["diagnostics"]["flip_experiments"]:
        if e["max_rel_change"] > FLIP_TOL:
            continue
        for lo, hi in e["positions_over_1e4"]:
            for p in range(lo, hi + 1):
                cover.setdefault(p, []).append(e)
    return cover


def describe(e):
    where = f"{e['site']} layer {e['layer']} row {e['row']}"
    if e.get("channel") is not None:
        where += f" head {e['head']} channel {e['channel']}"
    return f"{where} ({e['kind']}, gap {e['gap']:.2g}, effect {e['max_rel_change']:.2g})"


def check(fixture, ours):
    """Compare engine logits (flat array, [S, V]) with the oracle; returns (problems, summary)."""
    ref, orc, rows = load_oracle(fixture)
    S, V = orc["logits_shape"]
    problems = []
    if len(ours) != S * V:
        return [f"{fixture}: engine gave {len(ours)} floats, expected {S}x{V}"], ""
    errs = [rel_err(ours[p * V:(p + 1) * V], rows[p]) for p in range(S)]
    flipped = [p for p, e in enumerate(errs) if e > REL_TOL]
    cover = flip_cover(orc)
    if len(flipped) > MAX_FLIP_POSITIONS:
        problems.append(f"{fixture}: {len(flipped)} positions above {REL_TOL} (allowed {MAX_FLIP_POSITIONS} "
                        f"boundary flips): first {[(p, f'{errs[p]:.3g}') for p in flipped[:8]]}")
    for p in flipped:
        if errs[p] > FLIP_TOL:
            problems.append(f"{fixture} pos {p}: max rel error {errs[p]:.3g} > {FLIP_TOL}")
        if p not in cover:
            anyexp = [describe(e) for e in orc["diagnostics"]["flip_experiments"]
                      if any(lo <= p <= hi for lo, hi in e["positions_over_1e4"])]
            problems.append(f"{fixture} pos {p}: max rel error {errs[p]:.3g} > {REL_TOL}, not explained by a "
                            f"benign boundary flip; experiments covering it: {anyexp[:4] or 'none'}")
    for p in range(S):
        if errs[p] <= REL_TOL and top1(ours[p * V:(p + 1) * V]) != top1(rows[p]):
            problems.append(f"{fixture} pos {p}: top-1 {top1(ours[p * V:(p + 1) * V])} != oracle {top1(rows[p])}")
    clean = [e for e in errs if e <= REL_TOL]
    summary = (f"{fixture}: worst {max(errs):.3g} at pos {errs.index(max(errs))}; "
               f"{len(clean)} positions <= {REL_TOL} (worst {max(clean, default=0):.3g}); "
               f"{len(flipped)} above: {[(p, f'{errs[p]:.3g}') for p in flipped[:8]]}")
    return problems, summary


@pytest.mark.parametrize("fixture", FIXTURES)
def test_oracle_provenance(fixture):
    """The reference is what it claims: the wrappers, switched off, give transformers' bits (which are
    the fixture's ref_logits.f32), every official point was live, the run was deterministic."""
    ref, orc, rows = load_oracle(fixture)
    assert orc["semantics"].startswith("official")
    assert orc["logits_shape"] == [len(ref["input_ids"]), ref["vocab_size"]]
    ck = orc["checks"]
    assert ck["patches_off_equal_transformers_bitwise"] is True
    assert ck["transformers_vs_fixture_ref_logits_bitwise"] is True
    assert ck["deterministic"] is True
    for p in ("window_kv_fp8", "router_no_eps", "expert_weight_before_w2"):
        assert ck["calls"][p] >= 1, p
    assert ck["each_patch_alone"]["window_kv_fp8"]["max_rel_change_vs_transformers"] > 1e-3
    sites = orc["diagnostics"]["quantised_sites"]
    assert {"window_kv", "compressed_kv", "indexer_k", "indexer_q"} <= set(sites)
    for s in sites.values():
        assert s["scale_div_vs_mul_differs"] == 0   # amax/448 and amax*fl32(1/448): same power of two
    act = orc["act_quant_gemms"]
    if fixture in QUANTISED:
        # every quantised GEMM kind of the checkpoint was hooked and ran, and the point matters at REL_TOL
        assert {s for _, s in act["linear"]} == {"act_wq_a", "act_wq_b", "act_wkv", "act_wo_b", "act_indexer_wq_b",
                                                 "act_shared_w1", "act_shared_w3", "act_shared_w2"}
        assert act["experts"] and all(v["w1_w3"] > 0 and v["w2"] > 0 for v in act["experts"].values())
        assert ck["calls"]["gemm_act_fp8"] >= 1
        assert ck["each_patch_alone"]["gemm_act_fp8"]["max_rel_change_vs_transformers"] > 1e-3
        assert any(k.startswith("act_expert") for k in sites) and "act_wo_b" in sites
    else:
        assert not act["linear"] and not act["experts"]
        assert ck["each_patch_alone"]["gemm_act_fp8"]["bitwise_equal_to_transformers"] is True


@pytest.mark.parametrize("fixture", FIXTURES)
def test_official_matches_oracle(deepinfer, fixture):
    ref, orc, _ = load_oracle(fixture)
    ours = run_logits(deepinfer, fixture, ref["input_ids"], "official")
    problems, summary = check(fixture, ours)
    print(summary)
    assert not problems, "\n".join(problems[:20])


@pytest.mark.parametrize("fixture", FIXTURES)
def test_oracle_rejects_transformers_semantics(deepinfer, fixture):
    """The same checks fail when the engine runs without the official round trips."""
    ref, _, _ = load_oracle(fixture)
    ours = run_logits(deepinfer, fixture, ref["input_ids"], "transformers")
    problems, summary = check(fixture, ours)
    print(summary)
    assert problems, f"{fixture}: --semantics transformers passed the official oracle checks"
