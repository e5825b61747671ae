#!/usr/bin/python3
"""compare_runs.py REF_DIR RUN_DIR STEPS: two runs of examples/pytorch_train.py
(each DIR holds out.json and the checkpoint directory ck/) ended in the same
state: every tensor of the final checkpoints (parameters, buffers, every
optimizer state tensor) byte for byte, the optimizer's and sampler's blobs,
and exact step accounting (each step ran exactly once)."""
import json
import os
import sys

import torch

import grace


def final(run):
    ck = os.path.join(run, "ck")
    path = grace.checkpoint_path(ck)  # the newest one that verifies
    return path, grace.load(path), grace.read_manifest(path)


def raw(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def main(ref, run, steps):
    out = json.load(open(os.path.join(run, "out.json")))
    want = {"steps_done": steps, "step_index_sum": steps * (steps + 1) // 2}
    for k, v in want.items():
        if out[k] != v:
            sys.exit("%s: %s %s, want %s (a step ran twice or never)" % (run, k, out[k], v))
    ref_out = json.load(open(os.path.join(ref, "out.json")))
    if out["weights_checksum"] != ref_out["weights_checksum"]:
        sys.exit("%s: weights checksum %s, uninterrupted %s" % (run, out["weights_checksum"], ref_out["weights_checksum"]))
    rp, rt, rm = final(ref)
    p, t, m = final(run)
    if m["step"] != steps or rm["step"] != steps:
        sys.exit("final checkpoints at steps %d and %d, want %d" % (rm["step"], m["step"], steps))
    if sorted(t) != sorted(rt):
        sys.exit("tensor names differ: %s" % sorted(set(t) ^ set(rt)))
    for name in rt:
        a, b = rt[name], t[name]
        if a.dtype != b.dtype or a.shape != b.shape:
            sys.exit("'%s': %s %s vs %s %s" % (name, a.dtype, tuple(a.shape), b.dtype, tuple(b.shape)))
        if raw(a) != raw(b):
            sys.exit("'%s' differs from the uninterrupted run" % name)
    blobs = [k for k in rm["metadata"] if k.startswith("grace.blob.")]
    for k in blobs:
        if m["metadata"].get(k) != rm["metadata"][k]:
            sys.exit("blob %s differs from the uninterrupted run" % k[len("grace.blob."):])
    for k in ("steps_done", "step_index_sum"):
        if m["counters"][k] != want[k]:
            sys.exit("counter %s is %d in the final checkpoint, want %d" % (k, m["counters"][k], want[k]))
    n_opt = sum(1 for k in rt if k.startswith("optimizer."))
    print("%d tensors (%d optimizer) and %d blobs byte-identical to the uninterrupted run; %d steps exactly once"
          % (len(rt), n_opt, len(blobs), steps))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
