#!/usr/bin/python3
"""PyTorch baselines for bench/run (Debian python3-torch, /usr/bin/python3).

  torch_bench.py save --bytes B --file F        torch.save + fsync, then cold torch.load
  torch_bench.py allreduce --rank R --size 2 --store FILE --floats a,b --reps N
  torch_bench.py restart --state DIR            the worker torchrun restarts (see below)

One JSON object per line on stdout, as grace-bench.
"""
import argparse
import json
import os
import sys
import time


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def mode_save(a):
    import torch
    per = a.bytes // 4 // 4  # 4 tensors of float32, as grace-bench ckpt
    state = {}
    for i in range(4):
        t = torch.empty(per // 1024, 1024, dtype=torch.float32)
        t.fill_(float(i) + 0.5)
        state["layers.%d.weight" % i] = t
    if os.path.exists(a.file):
        os.unlink(a.file)
    t0 = time.perf_counter()
    with open(a.file, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    dfd = os.open(os.path.dirname(a.file) or ".", os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)
    t1 = time.perf_counter()
    del state
    evict(a.file)
    t2 = time.perf_counter()
    back = torch.load(a.file)
    t3 = time.perf_counter()
    assert float(back["layers.3.weight"][-1, -1]) == 3.5
    os.unlink(a.file)
    print(json.dumps({"row": "torch_save", "bytes": a.bytes, "save_s": t1 - t0, "save_gbps": a.bytes / (t1 - t0) / 1e9,
                      "load_s": t3 - t2, "load_gbps": a.bytes / (t3 - t2) / 1e9}), flush=True)


def mode_allreduce(a):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + a.store, rank=a.rank, world_size=a.size)
    for n in [int(x) for x in a.floats.split(",")]:
        v = torch.ones(n, dtype=torch.float32)
        ts = []
        for r in range(a.reps + 2):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(v, op=dist.ReduceOp.SUM)
            t1 = time.perf_counter()
            if r >= 2:
                ts.append(t1 - t0)
        if a.rank == 0:
            print(json.dumps({"row": "allreduce", "impl": "torch", "floats": n, "median_ms": median(ts) * 1e3}), flush=True)
    dist.destroy_process_group()


def mode_restart(a):
    """Run by torchrun. First attempt: every rank joins the process group,
    then rank 0 records the time and exits with an error. torchrun restarts
    the group; on the second attempt every rank records when its process
    group is ready (init_process_group + one barrier) and exits 0."""
    import torch.distributed as dist
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo")
    dist.barrier()
    if attempt == 0:
        if rank == 0:
            with open(os.path.join(a.state, "exit_ns"), "w") as f:
                f.write(str(time.time_ns()))
            os._exit(1)
        time.sleep(120)  # torchrun stops us when rank 0 fails
        return
    with open(os.path.join(a.state, "ready_%d_ns" % rank), "w") as f:
        f.write(str(time.time_ns()))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode")
    p.add_argument("--bytes", type=int, default=256 << 20)
    p.add_argument("--file", default="/tmp/torch-bench.pt")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--size", type=int, default=2)
    p.add_argument("--store", default="/tmp/torch-bench-store")
    p.add_argument("--floats", default="1048576")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--state", default="/tmp/torch-restart")
    a = p.parse_args()
    {"save": mode_save, "allreduce": mode_allreduce, "restart": mode_restart}[a.mode](a)


if __name__ == "__main__":
    sys.exit(main())
