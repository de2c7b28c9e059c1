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
# A quantised fixture quantises ~3.5M activations (gemm_act_fp8): too many near-midpoint elements for "a few
# flipped positions", since each flip cascades.  Its oracle json names the elements the engine rounds the other
# way ("engine_flips", found by tools/make_official_ref.py); each must lie this close to a midpoint (where the
# order of fp32 sums decides), and the oracle with exactly those forced must match every position.
ENGINE_FLIP_GAP = 1e-5
MAX_ENGINE_FLIPS = 48


def load_oracle(fixture):
    d = fixture_dir(fixture)
    with open(d / "ref.json", encoding="utf-8") as f:
        ref = json.load(f)
    if "input_ids" not in ref:  # a quantised fixture: ref.json points to its dequantised twin's
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


def load_flipped(fixture, orc):
    """The oracle's rows with the engine's recorded boundary flips forced (quantised fixtures)."""
    S, V = orc["logits_shape"]
    flat = array.array("f")
    with open(fixture_dir(fixture) / orc["engine_flips"]["logits_file"], "rb") as f:
        flat.frombytes(f.read())
    if sys.byteorder != "little":
        flat.byteswap()
    assert len(flat) == S * V
    return [flat[i * V:(i + 1) * V] for i in range(S)]


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
    ef = orc.get("engine_flips")
    if ef is not None:
        return check_flipped(fixture, ours, orc, rows, ef)
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


def check_flipped(fixture, ours, orc, rows, ef):
    """A quantised fixture: the forced flips are few and each within ENGINE_FLIP_GAP of a midpoint; the engine
    matches the clean oracle before the first flip's token, and the flipped oracle at every position."""
    S, V = orc["logits_shape"]
    problems = []
    forced = ef["forced"]
    if len(forced) > MAX_ENGINE_FLIPS:
        problems.append(f"{fixture}: {len(forced)} forced flips (allowed {MAX_ENGINE_FLIPS})")
    for f in forced:
        if not 0 <= f[5] < ENGINE_FLIP_GAP:
            problems.append(f"{fixture}: forced flip {f[:5]} is {f[5]:.2g} from its midpoint (> {ENGINE_FLIP_GAP})")
    if not all(st["explained"] for st in ef["steps"]):
        problems.append(f"{fixture}: the generator left a difference unexplained: {ef['steps'][-1]}")
    first = min((f[2] for f in forced), default=S)
    clean = [rel_err(ours[p * V:(p + 1) * V], rows[p]) for p in range(first)]
    bad = [p for p, e in enumerate(clean) if e > REL_TOL]
    if bad:
        problems.append(f"{fixture}: before the first forced flip (token {first}) positions {bad[:8]} differ from "
                        f"the oracle by more than {REL_TOL} (worst {max(clean):.3g})")
    frows = load_flipped(fixture, orc)
    errs = [rel_err(ours[p * V:(p + 1) * V], frows[p]) for p in range(S)]
    over = [p for p, e in enumerate(errs) if e > REL_TOL]
    if over:
        problems.append(f"{fixture}: {len(over)} positions differ from the oracle with the recorded flips forced by "
                        f"more than {REL_TOL}: {[(p, f'{errs[p]:.3g}') for p in over[:8]]} (if the engine's "
                        f"arithmetic changed, rerun tools/make_official_ref.py --only {fixture} to refresh them)")
    for p in range(S):
        if errs[p] <= REL_TOL and top1(ours[p * V:(p + 1) * V]) != top1(frows[p]):
            problems.append(f"{fixture} pos {p}: top-1 differs from the flipped oracle")
    summary = (f"{fixture}: {len(forced)} forced flips (first at token {first}, largest gap "
               f"{max((f[5] for f in forced), default=0):.2g}); before it worst {max(clean, default=0):.3g} vs the "
               f"clean oracle; worst {max(errs):.3g} vs the flipped oracle")
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
    if fixture in QUANTISED:
        # the twin's ref_logits.f32 came from tools/quantize_v4_fixture.py's own forward (same weights and math,
        # another run): not the same bits, within ~1e-5 of logits of std ~2.5
        assert ck["transformers_vs_fixture_ref_logits_max_abs"] <= 1e-4
    else:
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
        # every quantised GEMM of the checkpoint is hooked: the eight weight kinds model.py runs through linear()
        assert {n.split(".", 1)[1] if n.startswith("attn.") else n for _, n, _ in act["linear"]} == {
            "wq_a", "wq_b", "wkv", "wo_b", "indexer.wq_b", "ffn.shared_experts.w1", "ffn.shared_experts.w3",
            "ffn.shared_experts.w2"}
        assert act["experts"] and all(v["w1_w3"] > 0 and v["w2"] > 0 for v in act["experts"].values())
        assert ck["calls"]["gemm_act_fp8"] >= 1
        assert ck["each_patch_alone"]["gemm_act_fp8"]["max_rel_change_vs_transformers"] > 1e-3
        assert {"act_attn_x", "act_qr", "act_wo_b", "act_ffn_x", "act_shared_w2"} <= set(sites)
        assert any(k.startswith("act_expert") for k in sites)
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
