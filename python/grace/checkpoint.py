"""Reading Grace checkpoints without the runtime (no session, no cluster):
one process, any framework. A checkpoint is safetensors shards plus
model.safetensors.index.json; grace-manifest.json holds the step, counters,
blobs and every file's checksum (verified here by the module's C++ reader).

    model.load_state_dict(grace.load("grace-checkpoints", prefix="model."))
"""
import json
import os
import struct

import numpy as np

from . import _grace
from ._grace import GraceError

_NUMPY = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.int16,  # BF16: raw bits (torch takes int16, not uint16)
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}


def checkpoint_path(path, step=None, verify=True):
    """The step directory `path` names: itself if it holds a manifest, else
    the newest checkpoint under it that verifies (or `step`), as a restore
    would choose. Raises GraceError when there is none."""
    path = os.fspath(path)
    if os.path.exists(os.path.join(path, "grace-manifest.json")):
        if verify:
            _grace.verify(path)
        return path
    if not os.path.isdir(path):
        raise GraceError("%s: no such checkpoint or checkpoint directory" % path)
    reasons = []
    for c in reversed(_grace.list_checkpoints(path)):
        if c["temporary"] or c["set_aside"] or (step is not None and c["step"] != step):
            continue
        if not c["valid"]:
            reasons.append("%s: %s" % (c["path"], c["reason"]))
            continue
        try:
            if verify:
                _grace.verify(c["path"])
            return c["path"]
        except GraceError as e:
            reasons.append(str(e))
    what = "step %d" % step if step is not None else "a valid checkpoint"
    raise GraceError("%s: no %s%s" % (path, what, (" (" + "; ".join(reasons) + ")") if reasons else ""))


def read_manifest(path, step=None, verify=True):
    """grace-manifest.json of the checkpoint `path` names (step, counters,
    metadata with the blobs base64 under "grace.blob.<name>")."""
    with open(os.path.join(checkpoint_path(path, step, verify), "grace-manifest.json")) as f:
        return json.load(f)


def _header(f, path):
    raw = f.read(8)
    if len(raw) != 8:
        raise GraceError("%s: too short for a safetensors file" % path)
    (n,) = struct.unpack("<Q", raw)
    if n > 100 << 20:
        raise GraceError("%s: safetensors header of %d bytes" % (path, n))
    return json.loads(f.read(n)), 8 + n


def _read_file(path):
    """name -> (numpy array, safetensors dtype) of one safetensors file."""
    out = {}
    with open(path, "rb") as f:
        header, base = _header(f, path)
        entries = sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                         key=lambda kv: kv[1]["data_offsets"][0])
        for name, e in entries:
            dt = _NUMPY.get(e["dtype"])
            if dt is None:
                raise GraceError("%s: tensor '%s' has dtype %s, unknown here" % (path, name, e["dtype"]))
            begin, end = e["data_offsets"]
            count = int(np.prod(e["shape"], dtype=np.int64))
            if (end - begin) != count * np.dtype(dt).itemsize:
                raise GraceError("%s: tensor '%s' has %d bytes for shape %s" % (path, name, end - begin, e["shape"]))
            f.seek(base + begin)
            a = np.fromfile(f, dtype=dt, count=count)
            if a.size != count:
                raise GraceError("%s: tensor '%s' is truncated" % (path, name))
            out[name] = (a.reshape(e["shape"]), e["dtype"])
    return out


def _read_arrays(step_dir):
    """name -> (numpy array, safetensors dtype), in the index's order; a
    sharded tensor (the index's grace_sharded section, written by ranks that
    each held a slice) assembled from its parts at its global shape."""
    with open(os.path.join(step_dir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    weight_map, sharded = index["weight_map"], index.get("grace_sharded", {})
    files = {}

    def file(name):
        if name not in files:
            files[name] = _read_file(os.path.join(step_dir, name))
        return files[name]

    out = {}
    for name, shard in weight_map.items():
        if name in file(shard):
            out[name] = file(shard)[name]
    for name, t in sharded.items():
        dt = _NUMPY.get(t["dtype"])
        if dt is None:
            raise GraceError("%s: tensor '%s' has dtype %s, unknown here" % (step_dir, name, t["dtype"]))
        whole = np.zeros(t["shape"], dtype=dt)
        for p in t["parts"]:
            part, _ = file(p["file"])[name]
            whole[tuple(slice(o, o + n) for o, n in zip(p["offsets"], part.shape))] = part
        out[name] = (whole, t["dtype"])
    return out


def _select(tensors, prefix):
    if prefix is None:
        return tensors
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def load_numpy(path, *, step=None, prefix=None, verify=True):
    """dict name -> numpy array of the checkpoint `path` names (see
    checkpoint_path). `prefix`: keep the names under it, with it removed.
    numpy has no bfloat16: a BF16 tensor is an error here (use load)."""
    out = {}
    for name, (a, dtype) in _select(_read_arrays(checkpoint_path(path, step, verify)), prefix).items():
        if dtype == "BF16":
            raise GraceError("tensor '%s' is bfloat16, which numpy cannot hold: use grace.load (torch)" % name)
        out[name] = a
    return out


def load(path, *, step=None, prefix=None, verify=True):
    """dict name -> torch.Tensor of the checkpoint `path` names (see
    checkpoint_path), ready for model.load_state_dict with
    prefix="model.". Every file's checksum is verified first."""
    import torch
    out = {}
    for name, (a, dtype) in _select(_read_arrays(checkpoint_path(path, step, verify)), prefix).items():
        if dtype in ("U16", "U32", "U64"):
            raise GraceError("tensor '%s' is %s, which torch 1.13 cannot hold: use grace.load_numpy" % (name, dtype))
        t = torch.from_numpy(a)
        out[name] = t.view(torch.bfloat16) if dtype == "BF16" else t
    return out


def optimizer_state_dict(path, *, step=None, prefix="optimizer.", verify=True):
    """A torch.optim state_dict rebuilt from a checkpoint written by a
    session with register_optimizer(opt, prefix): pass it to
    optimizer.load_state_dict (for fine-tuning elsewhere, without Grace)."""
    import base64
    step_dir = checkpoint_path(path, step, verify)
    with open(os.path.join(step_dir, "grace-manifest.json")) as f:
        manifest = json.load(f)
    blob = manifest.get("metadata", {}).get("grace.blob." + prefix + "param_groups")
    if blob is None:
        raise GraceError("%s has no optimizer saved under the prefix '%s'" % (step_dir, prefix))
    extra = json.loads(base64.b64decode(blob))
    state = {}
    for name, t in load(step_dir, prefix=prefix + "state.", verify=False).items():
        i, key = name.split(".", 1)
        state.setdefault(int(i), {})[key] = t
    if manifest.get("counters", {}).get(prefix + "live", 1) == 0:
        state = {}
    for where, v in extra["scalars"].items():
        i, key = where.split(".", 1)
        state.setdefault(int(i), {})[key] = v
    return {"state": state, "param_groups": [dict(g) for g in extra["param_groups"]]}
