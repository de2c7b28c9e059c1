"""Access to the tiny DeepSeek-V4 reference checkpoints under tests/fixtures/model (stdlib only).

Written by tools/make_v4_fixtures.py and tools/quantize_v4_fixture.py. Each fixture directory holds
config.json, sharded safetensors + model.safetensors.index.json and, except the quantized
checkpoint (whose reference is its dequantized twin), ref.json + ref_logits.f32:
raw little-endian float32 rows, one per entry of ref["logits_positions"] (every position
0..seq_len-1 except for e2e-v4vocab, which stores a few rows plus ref["argmax"] / ref["topk"]
for every position).
"""
import json
import pathlib
import sys
from array import array

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE_ROOT = ROOT / "tests" / "fixtures" / "model"

# Fixtures with their own reference logits.
FIXTURES = [
    "tiny-mixed",
    "tiny-hash-swa",
    "tiny-hca16",
    "e2e-v4vocab",
    "tiny-mixed-fp8fp4-twin",
]
# Quantized checkpoint -> the fixture whose ref.json / ref_logits.f32 are its reference.
QUANTIZED = {"tiny-mixed-fp8fp4": "tiny-mixed-fp8fp4-twin"}


def fixture_dir(name):
    """Path of a fixture directory (raises if absent)."""
    p = FIXTURE_ROOT / name
    if not p.is_dir():
        raise FileNotFoundError(f"model fixture {name!r} not found at {p}")
    return p


def load_ref(name):
    """Return (ref_dict, logits): logits is a list of array('f') rows, row i holding the logits of
    position ref["logits_positions"][i] (vocab_size floats). A quantized fixture name resolves to
    its dequantized twin's reference."""
    name = QUANTIZED.get(name, name)
    d = fixture_dir(name)
    with open(d / "ref.json", encoding="utf-8") as f:
        ref = json.load(f)
    vocab = ref["vocab_size"]
    rows_n, cols = ref.get("logits_shape", [ref["seq_len"], vocab])
    if cols != vocab:
        raise ValueError(f"{name}: logits_shape {ref['logits_shape']} does not match vocab {vocab}")
    flat = array("f")
    with open(d / ref.get("logits_file", "ref_logits.f32"), "rb") as f:
        flat.frombytes(f.read())
    if sys.byteorder != "little":
        flat.byteswap()
    if len(flat) != rows_n * vocab:
        raise ValueError(f"{name}: ref_logits has {len(flat)} floats, expected {rows_n}x{vocab}")
    ref.setdefault("logits_positions", list(range(rows_n)))
    logits = [flat[i * vocab:(i + 1) * vocab] for i in range(rows_n)]
    return ref, logits


def load_config(name):
    with open(fixture_dir(name) / "config.json", encoding="utf-8") as f:
        return json.load(f)


if __name__ == "__main__":
    for n in FIXTURES + list(QUANTIZED):
        r, lg = load_ref(n)
        print(f"{n:26s} S={r['seq_len']:4d} V={r['vocab_size']:6d} rows={len(lg):4d} "
              f"std={r['logits_std']:.3f} seed={r.get('seed', r.get('source_seed'))}")
