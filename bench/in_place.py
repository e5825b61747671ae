#!/usr/bin/python3
"""Recovery in place against today's restart, side by side (issue 44).

One job per sample: N grace-train workers (about --state-mib of weights and
optimizer state each), SIGKILL of one rank once training runs, and the time
from the kill to the end of the first step of the group that trains on,
less that step's own time (its `first_step` event carries its duration):

  in place, spare     --recovery in-place --standby: a warm spare takes the rank
  in place, new       --recovery in-place: a new process takes the rank
  restart             --recovery restart: every process restarts and restores

Prints one table (median, p90, samples) and, with --jsonl, one JSON object
per sample. Also checks what each row claims: in place, one group for the
whole job and a replacement that took the state; restart, two groups.

  bench/in_place.py --launch build/grace-launch --train build/grace-train --nproc 8 --reps 10
  bench/in_place.py --launch build/grace-launch --python examples/pytorch_train.py --nproc 4 --dim 1024
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time


def events(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return out


def wait_for(path, pred, timeout):
    end = time.time() + timeout
    while time.time() < end:
        for e in events(path):
            if pred(e):
                return e
        time.sleep(0.01)
    raise RuntimeError(f"no event within {timeout} s in {path}")


def one(a, mode, work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    ev = os.path.join(work, "events.jsonl")
    largs = ["--recovery", "in-place" if mode != "restart" else "restart", "--max-restarts", "3"]
    if mode == "in place, spare":
        largs += ["--standby", "--standby-delay-ms", "0"]
    common = ["--device", "cpu", "--steps", str(a.steps), "--step-delay-ms", str(a.step_delay_ms),
              "--save-every", "100000", "--input-dim", str(a.dim)]
    if a.python:  # the PyTorch example: one hidden width, Grace's all_reduce_ (recover_in_place on)
        trainer = ["/usr/bin/python3", a.python] + common + ["--hidden", str(a.dim)]
    else:
        trainer = [a.train] + common + ["--hidden", str(a.dim), str(a.dim)]
    cmd = [a.launch, "--nproc", str(a.nproc), "--checkpoint-dir", "ck", "--quiet"] + largs + ["--"] + trainer
    env = dict(os.environ, GRACE_EVENTS_FILE=ev)
    with open(os.path.join(work, "log.txt"), "w") as log:
        job = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(ev, lambda e: e["event"] == "first_step", 120)
            if mode == "in place, spare":
                wait_for(ev, lambda e: e["event"] == "standby_ready", 120)
            time.sleep(a.settle_s)
            started = next(e for e in events(ev) if e["event"] == "group_started")
            victim = started["pids"]["1"]
            kill_ns = time.time_ns()
            os.kill(victim, signal.SIGKILL)
            if mode == "restart":
                first = wait_for(ev, lambda e: e["event"] == "first_step" and e["incarnation"] == 1, 120)
            else:
                first = wait_for(ev, lambda e: e["event"] == "first_step" and e["pid"] != victim and e["rank"] == 1
                                 and e["t_ns"] > kill_ns, 120)
            rc = job.wait(timeout=300)
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
    evs = events(ev)
    groups = sum(1 for e in evs if e["event"] == "group_started")
    rec = [e for e in evs if e["event"] == "recovered" and e.get("bytes", 0) > 0]
    ok = rc == 0 and (groups == 2 if mode == "restart" else groups == 1 and len(rec) >= 1)
    if mode == "restart":  # every rank's first step of the new group: the slowest counts
        firsts = [e for e in evs if e["event"] == "first_step" and e["incarnation"] == 1]
        first = max(firsts, key=lambda e: e["t_ns"])
    ms = (first["t_ns"] - kill_ns - first["ns"]) / 1e6
    return {"mode": mode, "nproc": a.nproc, "ms": ms, "ok": ok, "rc": rc, "groups": groups,
            "state_bytes": rec[0]["bytes"] if rec else 0,
            "spare": any(e["event"] == "worker_replaced" and e.get("spare") for e in evs)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--launch", required=True)
    p.add_argument("--train", help="grace-train (or --python)")
    p.add_argument("--python", help="a PyTorch trainer such as examples/pytorch_train.py instead of grace-train")
    p.add_argument("--nproc", type=int, default=8)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--dim", type=int, default=1024, help="--input-dim and two --hidden layers of this width")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--step-delay-ms", type=int, default=10)
    p.add_argument("--settle-s", type=float, default=1.0)
    p.add_argument("--work", default="/tmp/grace-bench-in-place")
    p.add_argument("--jsonl", help="append one JSON object per sample here")
    a = p.parse_args()
    if not a.train and not a.python:
        p.error("give --train grace-train or --python TRAINER.py")
    a.launch = os.path.abspath(a.launch)
    a.train = os.path.abspath(a.train) if a.train else None
    a.python = os.path.abspath(a.python) if a.python else None
    modes = ["in place, spare", "in place, new", "restart"]
    samples = {m: [] for m in modes}
    for r in range(a.reps):  # interleaved: the machine's noise hits every row alike
        for m in modes:
            s = one(a, m, os.path.join(a.work, m.replace(", ", "-").replace(" ", "-")))
            print(f"[in_place] rep {r} {m}: {s['ms']:.1f} ms{'' if s['ok'] else ' (CHECK FAILED)'}", file=sys.stderr)
            samples[m].append(s)
            if a.jsonl:
                with open(a.jsonl, "a") as f:
                    f.write(json.dumps(dict(s, bench="in_place")) + "\n")
    print(f"recovery after a SIGKILL, {a.nproc} {'PyTorch' if a.python else 'grace-train'} workers, "
          f"{max((s['state_bytes'] for v in samples.values() for s in v), default=0) / 2**20:.1f} MiB of state per rank:"
          " kill -> end of the first step of the group that trains on, less that step")
    print(f"{'':18} {'median ms':>10} {'p90 ms':>8} {'samples':>8} {'checks':>8}")
    base = statistics.median(s["ms"] for s in samples["restart"])
    for m in modes:
        v = sorted(s["ms"] for s in samples[m])
        p90 = v[min(len(v) - 1, int(round(0.9 * (len(v) - 1))))]
        bad = sum(1 for s in samples[m] if not s["ok"])
        print(f"{m:18} {statistics.median(v):10.1f} {p90:8.1f} {len(v):8d} {'ok' if not bad else f'{bad} FAIL':>8}"
              f"   ({statistics.median(v) / base:.2f}x restart)")
    return 0 if all(s["ok"] for v in samples.values() for s in v) else 1


if __name__ == "__main__":
    sys.exit(main())
