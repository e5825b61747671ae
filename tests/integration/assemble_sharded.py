#!/usr/bin/env python3
"""Assembles every tensor of a Grace checkpoint step directory without Grace:
the reference reader of docs/CHECKPOINT-FORMAT.md (standard library only).

    assemble_sharded.py STEP_DIR      prints "name dtype shape sha256" per tensor
    assemble_sharded.py FILE          the same for one safetensors file

Replicated tensors are read from the file `weight_map` names; a sharded
tensor is allocated at its global shape and each part listed under
`grace_sharded` is copied to its offsets (row-major boxes).
"""
import hashlib
import json
import struct
import sys
from pathlib import Path

SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
         "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}


def read_safetensors(path):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    return {k: (v["dtype"], v["shape"], data[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            for k, v in header.items()}


def place(dst, shape, part, offsets, pshape, elem):
    """Copies the row-major box `part` (shape pshape) into `dst` (shape) at offsets."""
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    run = pshape[-1] * elem
    count = 1
    for d in pshape[:-1]:
        count *= d
    for i in range(count):
        idx, rest = [], i
        for d in range(len(pshape) - 2, -1, -1):
            idx.insert(0, rest % pshape[d])
            rest //= pshape[d]
        at = sum((offsets[d] + idx[d]) * strides[d] for d in range(len(pshape) - 1)) + offsets[-1]
        dst[at * elem:at * elem + run] = part[i * run:(i + 1) * run]


def assemble(step_dir):
    index = json.loads((step_dir / "model.safetensors.index.json").read_text())
    files = {}

    def tensors_of(name):
        if name not in files:
            files[name] = read_safetensors(step_dir / name)
        return files[name]

    out = {}
    for name, file in index.get("weight_map", {}).items():
        dtype, shape, raw = tensors_of(file)[name]
        out[name] = (dtype, shape, bytes(raw))
    for name, t in index.get("grace_sharded", {}).items():
        shape, elem = t["shape"], SIZES[t["dtype"]]
        total = elem
        for d in shape:
            total *= d
        buf = bytearray(total)
        for p in t["parts"]:
            _, pshape, raw = tensors_of(p["file"])[name]
            place(buf, shape, raw, p["offsets"], pshape, elem)
        out[name] = (t["dtype"], shape, bytes(buf))
    return out


def main():
    path = Path(sys.argv[1])
    tensors = read_safetensors(path) if path.is_file() else assemble(path)
    for name, (dtype, shape, raw) in sorted(tensors.items()):
        print(name, dtype, "x".join(map(str, shape)), hashlib.sha256(raw).hexdigest())


if __name__ == "__main__":
    main()
