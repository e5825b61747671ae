#!/usr/bin/env python3
"""Independent reader for Grace checkpoints: python3 + numpy only.

Checks that a checkpoint step directory is valid Hugging Face style sharded
safetensors, without using any Grace code or the safetensors package, so a
bug shared by Grace's writer and reader cannot hide.

Usage:
  check_safetensors.py CKPT_STEP_DIR EXPECTED

EXPECTED is either
  - an .npz file: array name -> expected array (dtype, shape and bytes must
    match; bf16 has no numpy dtype, so compare such tensors as uint16), or
  - a .json file: {"tensors": {name: {"dtype": "F32", "shape": [..],
    "file": "raw little-endian bytes, relative to the json"}}}.

Exit 0 when every expected tensor is present and bit-identical, 1 otherwise.
"""
import json
import os
import struct
import sys

import numpy as np

DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}


def read_shard(path):
    """Returns {name: (dtype_name, shape, ndarray)} for one safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ValueError(f"{path}: header length {n} exceeds file size {len(blob)}")
    if (8 + n) % 8 != 0:
        raise ValueError(f"{path}: data section not 8-byte aligned")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info["dtype"]
        if dt not in DTYPES:
            raise ValueError(f"{path}: tensor {name}: unknown dtype {dt}")
        begin, end = info["data_offsets"]
        if not 0 <= begin <= end <= len(data):
            raise ValueError(f"{path}: tensor {name}: offsets {begin},{end} out of range")
        shape = tuple(info["shape"])
        arr = np.frombuffer(data[begin:end], dtype=DTYPES[dt])
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{path}: tensor {name}: {arr.size} elements for shape {shape}")
        out[name] = (dt, shape, arr.reshape(shape))
    return out


def load_expected(path):
    """Returns {name: (dtype_name or None, shape, ndarray)}."""
    if path.endswith(".npz"):
        with np.load(path) as z:
            return {k: (None, tuple(z[k].shape), z[k]) for k in z.files}
    with open(path) as f:
        spec = json.load(f)
    base = os.path.dirname(os.path.abspath(path))
    out = {}
    for name, info in spec["tensors"].items():
        raw = np.fromfile(os.path.join(base, info["file"]), dtype=DTYPES[info["dtype"]])
        shape = tuple(info["shape"])
        out[name] = (info["dtype"], shape, raw.reshape(shape))
    return out


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    step_dir, expected_path = argv[1], argv[2]
    with open(os.path.join(step_dir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    weight_map = index["weight_map"]
    found = {}
    for shard in sorted(set(weight_map.values())):
        for name, t in read_shard(os.path.join(step_dir, shard)).items():
            if weight_map.get(name) != shard:
                raise ValueError(f"{shard}: tensor {name} not mapped to this shard in the index")
            found[name] = t
    missing_in_shards = set(weight_map) - set(found)
    total = sum(t[2].nbytes for t in found.values())
    failures = []
    if missing_in_shards:
        failures.append(f"index lists tensors not in any shard: {sorted(missing_in_shards)}")
    if index.get("metadata", {}).get("total_size") != total:
        failures.append(f"index total_size {index.get('metadata', {}).get('total_size')} != {total}")
    expected = load_expected(expected_path)
    for name, (edt, eshape, earr) in expected.items():
        if name not in found:
            failures.append(f"{name}: missing from checkpoint")
            continue
        dt, shape, arr = found[name]
        if edt is not None and edt != dt:
            failures.append(f"{name}: dtype {dt}, expected {edt}")
        if shape != eshape:
            failures.append(f"{name}: shape {shape}, expected {eshape}")
            continue
        if edt is None and dt != "BF16" and np.dtype(DTYPES[dt]) != earr.dtype.newbyteorder("<"):
            failures.append(f"{name}: dtype {dt}, expected numpy {earr.dtype}")
        if arr.tobytes() != np.ascontiguousarray(earr).astype(earr.dtype.newbyteorder("<")).tobytes():
            failures.append(f"{name}: values differ")
    for f in failures:
        print("MISMATCH " + f)
    status = "OK" if not failures else "FAILED"
    print(f"{status}: {len(expected)} expected tensors, {len(found)} in checkpoint, "
          f"{len(set(weight_map.values()))} shards, {total} bytes, {len(failures)} mismatches")
    return 0 if not failures else 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        print(f"FAILED: {e}")
        sys.exit(1)
