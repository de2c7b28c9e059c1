#!/usr/bin/env python3
"""Write tests/fixtures/dtype/*.bin: reference tables for src/model/dtype.c.

The references come from an independent implementation, the `ml_dtypes`
package (pip install ml_dtypes==0.5.4 numpy), never from our C code.  The
files are checked in, so the C test (tests/unit/test_dtype.c) needs no Python;
run this script again only to regenerate them:

    python3 tools/gen_dtype_fixture.py [OUT_DIR]     # default tests/fixtures/dtype

All files are raw little-endian arrays without a header.

Decode tables (float32, one per code, in code order):
    e4m3.bin   256   float8_e4m3fn code  -> value
    ue8m0.bin  256   float8_e8m0fnu code -> value (code 0 is the f32 subnormal 2^-127)
    fp4.bin     16   float4_e2m1fn code  -> value
    bf16.bin 65536   bfloat16 bits       -> value
    f16.bin  65536   float16 bits        -> value
  NaN codes are stored as whatever NaN ml_dtypes produced; the test only
  checks that ours is NaN too (payloads are not part of the contract).  All
  other entries must match bit for bit (so -0 and +0 are distinct).

Encode tables (same N inputs for all three):
    enc_in.bin     float32 inputs: edges (zeros, subnormals, ties and their
                   neighbours in every target format, max, beyond max, inf, NaN)
                   then pseudo-random values from a fixed seed
    enc_e4m3.bin   uint8   float32 -> float8_e4m3fn code
    enc_fp4.bin    uint8   float32 -> float4_e2m1fn code
    enc_bf16.bin   uint16  float32 -> bfloat16 bits
  Where our contract differs from a plain ml_dtypes cast, the script applies
  the contract explicitly (spec model-v4.md §5.1):
    * e4m3: inputs are clipped to +-448 before the cast (we saturate; ml_dtypes
      gives NaN beyond 464), and NaN inputs are written as 0x7F (ml_dtypes
      keeps the sign).
    * fp4: NaN inputs are written as 0 (e2m1 has no NaN; ml_dtypes' result for
      NaN is arbitrary).  ml_dtypes already saturates to +-6.
    * bf16: unchanged; for NaN inputs the test checks only "is NaN".
"""
import os
import sys

import ml_dtypes
import numpy as np

E4M3 = ml_dtypes.float8_e4m3fn
E8M0 = ml_dtypes.float8_e8m0fnu
FP4 = ml_dtypes.float4_e2m1fn
BF16 = ml_dtypes.bfloat16


def decode(codes, dt):
    return np.asarray(codes).view(dt).astype(np.float32)


def ties_and_neighbours(values):
    """Midpoints between consecutive representable magnitudes, and one f32 ulp either side."""
    v = np.unique(np.abs(values[np.isfinite(values)]).astype(np.float64))
    mids = ((v[:-1] + v[1:]) / 2).astype(np.float32)
    out = [mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0)),
           v.astype(np.float32)]
    a = np.concatenate(out)
    return np.concatenate([a, -a])


def encode_inputs():
    rng = np.random.default_rng(20261129)
    e4m3_vals = decode(np.arange(256, dtype=np.uint8), E4M3)
    fp4_vals = decode(np.arange(16, dtype=np.uint8), FP4)
    f32 = np.float32
    edges = [
        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 448, -448, 449, 463.99, 464, 464.01,
                  465, 480, 500, 1e4, 3.4e38, -3.4e38, 6, 6.5, 7, 7.5, 8, 100, -100,
                  2.0 ** -6, 2.0 ** -7, 2.0 ** -9, 2.0 ** -10, 2.0 ** -10 * 1.0001, 3 * 2.0 ** -11,
                  1e-45, -1e-45, 1.1754942e-38, 1.1754944e-38, -1.1754944e-38], dtype=f32),
        ties_and_neighbours(e4m3_vals),
        ties_and_neighbours(fp4_vals),
        # bf16 ties: low 16 bits exactly 0x8000 with even and odd kept bit, and neighbours
        (rng.integers(0, 1 << 15, 200, dtype=np.uint32) << 17 | 0x8000).view(f32),
        (rng.integers(0, 1 << 15, 200, dtype=np.uint32) << 17 | 0x18000).view(f32),
        (rng.integers(0, 1 << 15, 200, dtype=np.uint32) << 17 | 0x7fff).view(f32),
        (rng.integers(0, 1 << 15, 200, dtype=np.uint32) << 17 | 0x8001).view(f32),
        # bf16 overflow to inf: values just below and above the rounding boundary
        np.array([0x7f7f7fff, 0x7f7f8000, 0x7f7fffff, 0xff7f8000], dtype=np.uint32).view(f32),
        # f32 subnormals, including ones that round to the smallest bf16 subnormals
        rng.integers(1, 0x800000, 200, dtype=np.uint32).view(f32),
    ]
    rand = [
        rng.uniform(-500, 500, 1000).astype(f32),
        rng.uniform(-7, 7, 1000).astype(f32),
        (rng.choice([-1, 1], 1000) * 2.0 ** rng.uniform(-14, 10, 1000)).astype(f32),
        rng.integers(0, 1 << 32, 1000, dtype=np.uint64).astype(np.uint32).view(f32),
    ]
    return np.concatenate(edges + rand).astype(f32)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "dtype")
    os.makedirs(out, exist_ok=True)

    def write(name, arr, dt):
        arr = np.ascontiguousarray(arr, dtype=np.dtype(dt).newbyteorder("<"))
        with open(os.path.join(out, name), "wb") as f:
            f.write(arr.tobytes())

    write("e4m3.bin", decode(np.arange(256, dtype=np.uint8), E4M3), np.float32)
    write("ue8m0.bin", decode(np.arange(256, dtype=np.uint8), E8M0), np.float32)
    write("fp4.bin", decode(np.arange(16, dtype=np.uint8), FP4), np.float32)
    write("bf16.bin", decode(np.arange(65536, dtype=np.uint32).astype(np.uint16), BF16), np.float32)
    write("f16.bin", np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
          .astype(np.float32), np.float32)

    x = encode_inputs()
    nan = np.isnan(x)
    with np.errstate(invalid="ignore", over="ignore"):
        e4m3 = np.clip(x, -448, 448).astype(E4M3).view(np.uint8).copy()
        fp4 = x.astype(FP4).view(np.uint8).copy()
        bf16 = x.astype(BF16).view(np.uint16).copy()
    e4m3[nan] = 0x7F
    fp4[nan] = 0
    write("enc_in.bin", x, np.float32)
    write("enc_e4m3.bin", e4m3, np.uint8)
    write("enc_fp4.bin", fp4, np.uint8)
    write("enc_bf16.bin", bf16, np.uint16)
    print(f"wrote {out}: {len(x)} encode inputs, ml_dtypes {ml_dtypes.__version__}")


if __name__ == "__main__":
    main()
