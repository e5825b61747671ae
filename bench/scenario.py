#!/usr/bin/python3
"""Process-level scenarios for bench/run: real grace-launch + grace-train
groups hit with signals, and torchrun's restart, timed from the structured
events (GRACE_EVENTS_FILE) and wall-clock stamps. One JSON object per line.

  scenario.py grace --launch L (--train T | --train-cmd 'CMD ARGS') --nproc N --work DIR [--kill]
      one group: SIGTERM to rank 1 -> reaction (agreed, committed, all
      exited) and restart (exit -> collectives ready -> first step); then,
      with --kill, SIGKILL of rank 1 in the restarted group (just-in-time
      save, restart) for the lost-work row; then SIGTERM to the launcher.
  scenario.py overlap --launch L --train T --nproc N --work DIR
      faults on top of faults: SIGKILL during an agreement, SIGKILL of the
      saver during its save, SIGKILL during a restore; steps lost and the
      time from each SIGKILL to the checkpoint committed for it.
  scenario.py sharded --launch L --train T --nproc N --work DIR [--replicas|--no-replicas] [--kill]
      ZeRO-1 (--shard-optimizer) with or without in-memory replicas: the
      step time of a fixed run (the replicas' per-step cost), or, with
      --kill, the steps lost to a SIGKILL of rank 2 at a random time.
  scenario.py torchrun --nproc N --work DIR
      torchrun restart of N workers: failing worker's exit -> every
      restarted worker's process group ready.
"""
import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

LAUNCHER = 0xFFFFFFFF
HERE = os.path.dirname(os.path.abspath(__file__))


class Events:
    def __init__(self, path):
        self.path = path
        self.pos = 0
        self.all = []

    def poll(self):
        try:
            with open(self.path) as f:
                f.seek(self.pos)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind("\n")
        if end < 0:
            return
        self.pos += len(data[: end + 1].encode())
        for line in data[: end + 1].splitlines():
            try:
                self.all.append(json.loads(line))
            except ValueError:
                pass

    def where(self, name, inc=None, rank=None):
        return [e for e in self.all if e["event"] == name and (inc is None or e.get("incarnation") == inc)
                and (rank is None or e.get("rank") == rank)]

    def wait(self, cond, timeout, what):
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.poll()
            r = cond()
            if r:
                return r
            time.sleep(0.005)
        raise TimeoutError(what)


def workers_stepping(ev, inc, n):
    firsts = {e["rank"]: e for e in ev.where("first_step", inc)}
    return firsts if len(firsts) >= n else None


def ms(a, b):
    return (b - a) / 1e6


def lost_work(ev, inc):
    """Steps re-run after the restart: the last step any worker of `inc`
    completed (its exit or commit events) minus the step the next
    incarnation resumed from (as grace-chaos computes it)."""
    reached = max([e.get("step", -1) for e in ev.where("exit", inc) + ev.where("committed_local", inc)] + [-1])
    restored = max([e["step"] for e in ev.where("restored", inc + 1)] +
                   [e["step"] - 1 for e in ev.where("first_step", inc + 1)] + [0])
    return reached, restored, max(0, reached - restored)


def restart_times(ev, inc, n):
    """From the first worker exit with the restart code in `inc` to the
    restarted group's collectives being ready (every worker entered its
    first step, i.e. restored and connected Gloo) and its first step done."""
    exits = [e for e in ev.where("worker_exit", inc) if e.get("code") == 42 or e.get("signal")]
    first_exit = min(e["t_ns"] for e in exits)
    last_exit = max(e["t_ns"] for e in ev.where("worker_exit", inc))
    firsts = ev.where("first_step", inc + 1)
    ready = max(e["t_ns"] - e["ns"] for e in firsts)
    done = max(e["t_ns"] for e in firsts)
    started = [e["t_ns"] for e in ev.where("group_started", inc + 1)]
    restored = [e for e in ev.where("restored", inc + 1)]
    return {
        "exit_to_ready_ms": ms(first_exit, ready),
        "exit_to_first_step_ms": ms(first_exit, done),
        "last_exit_to_ready_ms": ms(last_exit, ready),
        "exit_to_group_started_ms": ms(first_exit, started[0]) if started else None,
        "restore_ms": max(e["ns"] for e in restored) / 1e6 if restored else None,
    }


def grace_group(a):
    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    events_path = os.path.join(work, "events.jsonl")
    env = dict(os.environ, GRACE_EVENTS_FILE=events_path)
    train = shlex.split(a.train_cmd) if a.train_cmd else [a.train]
    cmd = [a.launch, "--nproc", str(a.nproc), "--checkpoint-dir", os.path.join(work, "ckpt"), "--max-restarts", "3",
           "--quiet"] + shlex.split(a.launch_args) + ["--"] + train + ["--steps", "1000000", "--step-delay-ms", str(a.step_delay_ms)]
    if a.hidden:
        cmd += ["--hidden", a.hidden]
    log = open(os.path.join(work, "launch.log"), "w")
    p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    ev = Events(events_path)
    out = {"row": "group", "nproc": a.nproc, "step_delay_ms": a.step_delay_ms, "trainer": a.label}
    try:
        t = a.timeout
        w0 = ev.wait(lambda: workers_stepping(ev, 0, a.nproc), t, "group 0 did not start")
        time.sleep(0.5)
        standby = "--standby" in a.launch_args
        if standby:  # the row measures a restart onto ready spares
            ev.wait(lambda: ev.where("standby_ready", 0), t, "spares of group 0 not ready")
        # The step time: the trainer's steady-state step is the delay plus a
        # tiny MLP step and the allreduce.
        target = w0[1]["pid"]
        t_kill = time.time_ns()
        os.kill(target, signal.SIGTERM)
        w1 = ev.wait(lambda: workers_stepping(ev, 1, a.nproc), t, "group 1 did not start after SIGTERM")
        agreed = ev.where("agreed", 0)[0]["t_ns"]
        committed = ev.where("committed", 0)[0]["t_ns"]
        exits = ev.where("worker_exit", 0)
        all_exited = max(e["t_ns"] for e in exits)
        notice = [e["t_ns"] for e in ev.where("notice", 0)]
        received = [e["received_ns"] for e in ev.where("notice", 0) if e.get("received_ns")]
        claim = [e["t_ns"] for e in ev.where("claim", 0)]
        proposed = [e["t_ns"] for e in ev.where("proposed", 0)]
        snap = ev.where("snapshot_done", 0)
        local = ev.where("committed_local", 0)
        reached = [e["t_ns"] for e in ev.where("reached_agreed_step", 0)]
        write_ms = sum(e["write_ns"] for e in local) / 1e6
        snap_ms = sum(e["ns"] for e in snap) / 1e6
        out.update({
            "agreed_ms": ms(t_kill, agreed),
            "notice_ms": ms(t_kill, min(notice)) if notice else None,
            # the signal watcher's stamp (signal taken) vs the peer watcher's (claim sent)
            "watcher_ms": ms(t_kill, min(received)) if received else None,
            "claim_to_agreed_ms": ms(min(claim), agreed) if claim else None,
            "proposed_to_agreed_ms": ms(min(proposed), agreed) if proposed else None,
            "committed_ms": ms(t_kill, committed),
            "exited_ms": ms(t_kill, all_exited),
            "reached_ms": ms(t_kill, max(reached)) if reached else None,
            "write_ms": write_ms,
            "snapshot_ms": snap_ms,
            "step_ms": a.step_delay_ms,
            "codes": sorted(e.get("code") for e in exits),
        })
        # The real step time of this group (on 2 cores, 4 and 8 workers take
        # longer than the configured delay: compute and the ring allreduce
        # queue for the CPUs): per rank, from its first step to the step it
        # stopped at, the median over ranks.
        firsts = {e["rank"]: e for e in ev.where("first_step", 0)}
        per = []
        for e in ev.where("reached_agreed_step", 0):
            f = firsts.get(e["rank"])
            if f and e["step"] > f["step"]:
                per.append((e["t_ns"] - f["t_ns"]) / 1e6 / (e["step"] - f["step"]))
        out["measured_step_ms"] = sorted(per)[len(per) // 2] if per else None
        # Protocol overhead: the time to all exited minus one step (the most
        # a worker runs on to reach the agreed step) minus the write.
        out["overhead_ms"] = out["exited_ms"] - a.step_delay_ms - write_ms - snap_ms
        if out["measured_step_ms"]:
            out["overhead_measured_step_ms"] = out["exited_ms"] - out["measured_step_ms"] - write_ms - snap_ms
        # Reaching the agreed step took `reached_ms`; what follows it that is
        # not the write is protocol + process exit.
        if reached:
            out["after_step_overhead_ms"] = out["exited_ms"] - out["reached_ms"] - write_ms - snap_ms
        out.update(restart_times(ev, 0, a.nproc))
        r, s, lost = lost_work(ev, 0)
        out.update({"sigterm_reached": r, "sigterm_restored": s, "sigterm_lost": lost})
        if a.kill:
            time.sleep(0.5)
            if standby:
                ev.wait(lambda: ev.where("standby_ready", 1), t, "spares of group 1 not ready")
            os.kill(w1[1]["pid"], signal.SIGKILL)
            ev.wait(lambda: workers_stepping(ev, 2, a.nproc), t, "group 2 did not start after SIGKILL")
            r, s, lost = lost_work(ev, 1)
            out.update({"sigkill_reached": r, "sigkill_restored": s, "sigkill_lost": lost})
            kr = restart_times(ev, 1, a.nproc)
            out["sigkill_exit_to_ready_ms"] = kr["exit_to_ready_ms"]
        os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=t)
    except Exception as e:  # report, clean up, let the driver go on
        out["error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        # Leftover workers (only after a failure): by pid from the events.
        ev.poll()
        for pid in {e["pid"] for e in ev.all if e.get("rank") != LAUNCHER}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()
    print(json.dumps(out), flush=True)
    if not a.keep:
        shutil.rmtree(os.path.join(work, "ckpt"), ignore_errors=True)


def run_sharded(a):
    """One sharded run (row 7s): the per-step time, or the work a SIGKILL of
    rank 2 costs, with or without replicas."""
    import random
    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    events_path = os.path.join(work, "events.jsonl")
    env = dict(os.environ, GRACE_EVENTS_FILE=events_path)
    steps = 400 if not a.kill else 1000000
    cmd = [a.launch, "--nproc", str(a.nproc), "--checkpoint-dir", os.path.join(work, "ckpt"), "--max-restarts", "3",
           "--quiet", "--", a.train, "--shard-optimizer", "--steps", str(steps), "--step-delay-ms",
           str(a.step_delay_ms), "--save-every", "50"]
    if a.hidden:
        cmd += ["--hidden", a.hidden]
    if not a.replicas:
        cmd += ["--no-replicas"]
    log = open(os.path.join(work, "launch.log"), "w")
    p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    ev = Events(events_path)
    out = {"row": "sharded_kill" if a.kill else "replica_cost", "nproc": a.nproc, "replicas": a.replicas,
           "hidden": a.hidden, "step_delay_ms": a.step_delay_ms}
    try:
        ev.wait(lambda: workers_stepping(ev, 0, a.nproc), a.timeout, "group 0 did not start")
        if a.kill:
            time.sleep(1.0 + random.random())
            victim = [e for e in ev.where("first_step", 0) if e["rank"] == 2][0]["pid"]
            os.kill(victim, signal.SIGKILL)
            ev.wait(lambda: workers_stepping(ev, 1, a.nproc), a.timeout, "group 1 did not start after SIGKILL")
            r, s, lost = lost_work(ev, 0)
            out.update({"reached": r, "restored": s, "lost": lost})
            os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=a.timeout)
        ev.poll()
        if not a.kill:
            firsts = {e["rank"]: e for e in ev.where("first_step", 0)}
            per = [(e["t_ns"] - firsts[e["rank"]]["t_ns"]) / 1e6 / (steps - 1) for e in ev.where("finished", 0)
                   if e["rank"] in firsts]
            out["step_ms"] = sorted(per)[len(per) // 2] if per else None
    except Exception as e:
        out["error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        log.close()
    print(json.dumps(out), flush=True)
    shutil.rmtree(os.path.join(work, "ckpt"), ignore_errors=True)


def committed_after(ev, inc, t_ns):
    """The first commit in incarnation `inc` at or after t_ns (any kind)."""
    c = [e for e in ev.where("committed", inc) if e["t_ns"] >= t_ns]
    return min(c, key=lambda e: e["t_ns"]) if c else None


def overlap_faults(a):
    """Faults on top of faults in one group, each measured on its own:
    SIGKILL during an agreement (a SIGTERM, then a SIGKILL as soon as the
    proposal is out), SIGKILL of the saver while its save is in flight, and
    SIGKILL during a restore (right after the restarted group started).
    For each: steps lost (as grace-chaos counts them) and the time from the
    SIGKILL to the committed checkpoint that covers it."""
    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    events_path = os.path.join(work, "events.jsonl")
    env = dict(os.environ, GRACE_EVENTS_FILE=events_path)
    cmd = [a.launch, "--nproc", str(a.nproc), "--checkpoint-dir", os.path.join(work, "ckpt"), "--max-restarts", "10",
           "--dead-after-ms", str(a.dead_after_ms), "--quiet", "--", a.train, "--steps", "1000000",
           "--step-delay-ms", str(a.step_delay_ms), "--hidden", a.hidden or "1024,1024"]
    log = open(os.path.join(work, "launch.log"), "w")
    p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    ev = Events(events_path)
    out = {"row": "overlap", "nproc": a.nproc, "dead_after_ms": a.dead_after_ms}

    def pid_of(inc, rank):
        g = ev.where("group_started", inc)
        return g[0]["pids"][str(rank)] if g and "pids" in g[0] else None

    def after(name, inc, t_ns):
        return lambda: [e for e in ev.where(name, inc) if e["t_ns"] >= t_ns]

    def measure(label, inc, t_kill):
        ev.wait(lambda: workers_stepping(ev, inc + 1, a.nproc), a.timeout, label + ": no restart")
        c = committed_after(ev, inc, t_kill)
        r, s, lost = lost_work(ev, inc)
        exits = [e["t_ns"] for e in ev.where("worker_exit", inc)]
        out[label + "_lost"] = lost
        # No commit: nothing newer than the restored checkpoint to write.
        out[label + "_commit_ms"] = ms(t_kill, c["t_ns"]) if c else None
        out[label + "_stopped_ms"] = ms(t_kill, max(exits)) if exits else None
        return inc + 1

    try:
        t = a.timeout
        inc = 0
        ev.wait(lambda: workers_stepping(ev, inc, a.nproc), t, "group 0 did not start")
        time.sleep(0.3)
        # 1. SIGKILL during an agreement.
        t0 = time.time_ns()
        os.kill(pid_of(inc, 1), signal.SIGTERM)
        ev.wait(after("proposed", inc, t0), t, "no proposal")
        t_kill = time.time_ns()
        os.kill(pid_of(inc, 2), signal.SIGKILL)
        inc = measure("agreement_kill", inc, t_kill)
        time.sleep(0.3)
        # 2. SIGKILL of the saver (the chief) while its save is in flight.
        t0 = time.time_ns()
        os.kill(pid_of(inc, 1), signal.SIGTERM)
        ev.wait(lambda: [e for e in after("snapshot_done", inc, t0)() if e.get("rank") == 0], t, "no snapshot")
        t_kill = time.time_ns()
        os.kill(pid_of(inc, 0), signal.SIGKILL)
        inc = measure("saver_kill", inc, t_kill)
        time.sleep(0.3)
        # 3. SIGKILL during a restore: kill one, then another as soon as the
        # restarted group is started (its members are restoring).
        os.kill(pid_of(inc, 1), signal.SIGKILL)
        ev.wait(lambda: ev.where("group_started", inc + 1), t, "no restart after the first SIGKILL")
        inc += 1
        t_kill = time.time_ns()
        os.kill(pid_of(inc, 2), signal.SIGKILL)
        out["restore_kill_restored_before"] = max([e["step"] for e in ev.where("restored", inc)] + [-1])
        inc = measure("restore_kill", inc, t_kill)
        os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=t)
    except Exception as e:
        out["error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        ev.poll()
        for pid in {e["pid"] for e in ev.all if e.get("rank") != LAUNCHER}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()
    print(json.dumps(out), flush=True)
    if not a.keep:
        shutil.rmtree(os.path.join(work, "ckpt"), ignore_errors=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def torchrun_restart(a):
    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    cmd = ["/usr/bin/torchrun", "--nproc_per_node", str(a.nproc), "--max_restarts", "1", "--redirects", "9:1",
           "--tee", "9:1", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           os.path.join(HERE, "torch_bench.py"), "restart", "--state", work]
    out = {"row": "torchrun", "nproc": a.nproc}
    with open(os.path.join(work, "torchrun.log"), "w") as log:
        try:
            subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=a.timeout, check=False,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
            exit_ns = int(open(os.path.join(work, "exit_ns")).read())
            ready = [int(open(os.path.join(work, "ready_%d_ns" % r)).read()) for r in range(a.nproc)]
            out["exit_to_ready_ms"] = ms(exit_ns, max(ready))
        except Exception as e:
            out["error"] = "%s: %s" % (type(e).__name__, e)
    print(json.dumps(out), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["grace", "torchrun", "overlap", "sharded"])
    p.add_argument("--launch")
    p.add_argument("--train")
    p.add_argument("--train-cmd", default="", help="a trainer command instead of --train (e.g. "
                   "'/usr/bin/python3 examples/pytorch_train.py'; it takes grace-train's flags)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--work", default="/tmp/grace-scenario")
    p.add_argument("--kill", action="store_true")
    p.add_argument("--launch-args", default="", help="more grace-launch flags (e.g. --standby)")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--hidden", default="")
    p.add_argument("--label", default="as built")
    p.add_argument("--replicas", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--step-delay-ms", type=int, default=20)
    p.add_argument("--dead-after-ms", type=int, default=3000)
    p.add_argument("--timeout", type=float, default=90)
    a = p.parse_args()
    if a.mode == "grace":
        grace_group(a)
    elif a.mode == "sharded":
        run_sharded(a)
    elif a.mode == "overlap":
        overlap_faults(a)
    else:
        torchrun_restart(a)


if __name__ == "__main__":
    sys.exit(main())
