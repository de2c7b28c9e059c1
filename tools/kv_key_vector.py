#!/usr/bin/env python3
"""Golden prefix-block keys, computed independently of the C code.

Implements the block key encoding of docs/KV.md ("Block identity") with
hashlib, for the fixed inputs that tests/unit/test_kv.c uses; the test holds
this script's output.  Run: python3 tools/kv_key_vector.py
"""
import hashlib
import struct

TAG = b"deepinfer-kv-v1"


def kv_key(parent, ids, model_fp, semantics, salt):
    """parent: 32 bytes or None; ids: token ids; model_fp: 32 bytes; salt: str"""
    s = salt.encode("utf-8")
    h = hashlib.sha256()
    h.update(TAG)
    h.update(b"\x01" + parent if parent is not None else b"\x00")
    h.update(model_fp)
    h.update(struct.pack("<B", semantics))
    h.update(struct.pack("<I", len(s)) + s)
    h.update(struct.pack("<I", len(ids)))
    h.update(struct.pack("<%di" % len(ids), *ids))
    return h.digest()


def main():
    fp = bytes(range(32))
    block0 = [(i * 7919 + 13) % 129280 for i in range(128)]
    block1 = [(i * 104729 + 7) % 129280 for i in range(128)]
    k0 = kv_key(None, block0, fp, 0, "tenant-a")
    k1 = kv_key(k0, block1, fp, 0, "tenant-a")
    k2 = kv_key(None, block0, fp, 1, "")
    print("block0 (no parent, official, salt 'tenant-a'):  ", k0.hex())
    print("block1 (parent block0):                         ", k1.hex())
    print("block0 (no parent, transformers, empty salt):   ", k2.hex())


if __name__ == "__main__":
    main()
