#!/usr/bin/python3
"""The Python module's benchmarks for bench/run (Debian's /usr/bin/python3,
python3-torch; the module from $PYTHONPATH, e.g. build/python). One JSON
object per line, as grace-bench.

  python_bench.py steps --iters N --reps R
      per-step cost of `for step in g.steps(n)` against `for step in range(n)`
      (empty bodies, nothing pending; one process, local mode), without and
      with the RNG and a sampler registered as blobs (snapshotted every step)
  python_bench.py save --impl grace|torch --bytes B --saves K --dir D
      a PyTorch model + AdamW state of B bytes saved K times back to back in
      one fresh process: Grace (periodic saves: the snapshot plus the durable
      write until committed) or torch.save + fsync of the same state_dict;
      the first save and the median of the others. For Grace also the
      training stall (its snapshot) and, right before each snapshot, a
      memcpy of the same tensors into touched buffers.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

import grace


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


class Position:
    """A stand-in for a data sampler's state."""

    def __init__(self):
        self.i = 0

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, s):
        self.i = s["i"]


def time_loops(g, n):
    t0 = time.perf_counter_ns()
    for _ in range(n):
        pass
    t1 = time.perf_counter_ns()
    for _ in g.steps(g.completed_steps + n):
        pass
    t2 = time.perf_counter_ns()
    return (t1 - t0) / n, (t2 - t1) / n


def mode_steps(a):
    grace.set_log_level("warn")  # stdout is the results
    for blobs in (False, True):
        d = tempfile.mkdtemp(prefix="grace-bench-steps-", dir=a.dir)
        try:
            with grace.Session(os.path.join(d, "ck"), exit_on_stop=False) as g:
                g.register_array("w", np.zeros(16, np.float32))
                if blobs:
                    g.register_rng()
                    g.register_stateful("sampler", Position())
                g.attach()
                n = a.iters // 50 if blobs else a.iters  # ~25 us a step with blobs
                time_loops(g, min(n, 100000))  # warm up
                r = [time_loops(g, n) for _ in range(a.reps)]
            rng, steps = median([x[0] for x in r]), median([x[1] for x in r])
            print(json.dumps({"row": "py_steps", "blobs": int(blobs), "iters": n, "range_ns": rng,
                              "steps_ns": steps, "overhead_ns": steps - rng}), flush=True)
        finally:
            shutil.rmtree(d, ignore_errors=True)


def make_state(total_bytes):
    """Parameters of total_bytes / 3 (AdamW adds two moments of the same
    size) as 4 MiB matrices, and AdamW with its state created."""
    import torch
    chunk = 1 << 20  # floats: 4 MiB
    n = max(1, total_bytes // 3 // (4 * chunk))
    params = torch.nn.ParameterList([torch.nn.Parameter(torch.full((1024, chunk // 1024), float(i)))
                                     for i in range(n)])
    opt = torch.optim.AdamW(params.parameters(), lr=1e-3)
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    opt.step()
    return params, opt


def state_bytes(params, opt):
    import torch
    n = sum(p.numel() * p.element_size() for p in params)
    for st in opt.state.values():
        n += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
    return n


def read_events(events, mark):
    with open(events) as f:
        f.seek(mark)
        return [json.loads(l) for l in f if l.strip()]


def grace_saves(params, opt, d, events, saves, copy):
    """One session, `saves` periodic saves; each step waits until the
    previous save is on disk, so a snapshot never waits for a write, then
    times `copy()` (the memcpy baseline, right before the snapshot).
    Returns [(snapshot s, capture start until committed s, memcpy s)]."""
    open(events, "a").close()
    with open(events) as f:
        f.seek(0, 2)
        mark = f.tell()

    def committed(step):
        return any(e["event"] == "committed_local" and e["step"] == step for e in read_events(events, mark))

    copies = []
    with grace.Session(os.path.join(d, "ck"), save_every=1, keep_checkpoints_on_success=True,
                       exit_on_stop=False) as g:
        g.register_module(params)
        g.register_optimizer(opt)
        g.attach()
        for step in g.steps(saves):
            while step > 1 and not committed(step - 1):
                time.sleep(0.005)
            copies.append(copy())
        while not committed(saves):
            time.sleep(0.005)
    ev = read_events(events, mark)
    snap = {e["step"]: e["ns"] / 1e9 for e in ev if e["event"] == "snapshot_done"}
    # save_ns: from the capture's start to the commit (the write overlaps the capture).
    total = {e["step"]: e["save_ns"] / 1e9 for e in ev if e["event"] == "committed_local"}
    return [(snap[s], total[s], copies[s - 1]) for s in range(1, saves + 1)]


def torch_saves(params, opt, d, saves):
    import torch
    out = []
    for _ in range(saves):
        path = os.path.join(d, "state.pt")
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save({"model": params.state_dict(), "optimizer": opt.state_dict()}, f)
            f.flush()
            os.fsync(f.fileno())
        fd = os.open(d, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        out.append(time.perf_counter() - t0)
        os.unlink(path)
    return out


def memcpy(params, opt):
    """A function timing one memcpy of every saved tensor into buffers of the
    same sizes, touched beforehand: what a snapshot cannot beat."""
    import ctypes
    import torch
    src = list(params) + [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)]
    dst = [torch.zeros_like(t) for t in src]
    jobs = [(t.data_ptr(), s.data_ptr(), s.numel() * s.element_size()) for s, t in zip(src, dst)]

    def run(dst=dst):  # holds the buffers: `jobs` has only their addresses
        t0 = time.perf_counter()
        for d, s, n in jobs:
            ctypes.memmove(d, s, n)
        return time.perf_counter() - t0
    run()
    return run


def mode_save(a):
    """One process, one implementation: `saves` saves back to back; the first
    is what a trainer pays at its first save after starting, the others the
    steady state. bench/run runs grace and torch in separate processes,
    interleaved."""
    import torch
    torch.set_num_threads(1)
    grace.set_log_level("warn")
    params, opt = make_state(a.bytes)
    total = state_bytes(params, opt)
    d = tempfile.mkdtemp(prefix="grace-bench-save-", dir=a.dir)
    try:
        row = {"row": "py_save", "impl": a.impl, "bytes": a.bytes, "state_bytes": total, "saves": a.saves}
        if a.impl == "grace":
            events = os.environ.get("GRACE_EVENTS_FILE")
            if not events:
                sys.exit("python_bench.py save --impl grace: set GRACE_EVENTS_FILE (the save times are its events)")
            r = grace_saves(params, opt, d, events, a.saves, memcpy(params, opt))
            steady = r[1:] or r
            row.update({"first_s": r[0][1], "steady_s": median([x[1] for x in r[1:]]) if len(r) > 1 else None,
                        "snapshot_ms": median([x[0] for x in steady]) * 1e3,
                        "memcpy_ms": median([x[2] for x in steady]) * 1e3})
        else:
            r = torch_saves(params, opt, d, a.saves)
            row.update({"first_s": r[0], "steady_s": median(r[1:]) if len(r) > 1 else None})
        print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["steps", "save"])
    p.add_argument("--iters", type=int, default=1000000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--bytes", type=int, default=256 << 20)
    p.add_argument("--saves", type=int, default=3, help="saves in the process (the first, then the steady state)")
    p.add_argument("--impl", choices=["grace", "torch"], default="grace")
    p.add_argument("--dir", default=None, help="scratch directory (checkpoints, torch.save files)")
    a = p.parse_args()
    if a.dir:
        os.makedirs(a.dir, exist_ok=True)
    mode_steps(a) if a.mode == "steps" else mode_save(a)


if __name__ == "__main__":
    main()
