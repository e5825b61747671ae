#!/usr/bin/python3
"""The Python module in one process (local mode: the coordinator in-process,
same save/restore/stop semantics as a cluster): registration by memory,
counters and blobs restored before the first resumed step, lazily created
optimizer state, a stop that leaves the loop, Ctrl-C as a notice, bad input
as clear exceptions, grace.load without the runtime.

Run by CTest with /usr/bin/python3 and PYTHONPATH=<build>/python; exits 77
(skipped) only when torch is missing.
"""
import ctypes
import json
import re
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import unittest

import numpy as np

import time

import grace

try:
    import torch
    import torch.nn as nn
except ImportError:
    print("SKIP: python3-torch is not installed (apt-get install python3-torch)")
    sys.exit(77)

FOREVER = 10 ** 9  # a loop that only a stop ends
EVENTS = tempfile.mktemp(prefix="grace-py-events-")
os.environ["GRACE_EVENTS_FILE"] = EVENTS  # read by Grace at its first event
grace.set_log_level("warn")


def events(name):
    try:
        with open(EVENTS) as f:
            return [e for e in map(json.loads, f) if e["event"] == name]
    except FileNotFoundError:
        return []


class TempDir:
    def __enter__(self):
        self.path = tempfile.mkdtemp(prefix="grace-py-")
        return self.path

    def __exit__(self, *exc):
        shutil.rmtree(self.path, ignore_errors=True)


def session(d, **kw):
    kw.setdefault("exit_on_stop", False)
    return grace.Session(os.path.join(d, "ck"), **kw)


def launch_script(test, d, source, nproc, args, launcher_args=()):
    """Writes `source` to d/worker.py and runs it under grace-launch with
    `nproc` workers; returns (exit code, stdout + stderr). A job that does
    not end within 120 s fails the test with what it printed."""
    script = os.path.join(d, "worker.py")
    with open(script, "w") as f:
        f.write(source)
    cmd = [os.environ["GRACE_LAUNCH"], "--nproc", str(nproc)] + list(launcher_args) + \
        ["--", sys.executable, script] + [str(a) for a in args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        def text(b):
            return (b.decode(errors="replace") if isinstance(b, bytes) else b or "")[-3000:]
        test.fail("grace-launch did not end within 120 s:\n%s\n%s" % (text(e.stdout), text(e.stderr)))
    return out.returncode, out.stdout + out.stderr


class NumpyState(unittest.TestCase):
    def run_steps(self, d, total, notify_at=None):
        """Steps that add their index to an array, a counter and a blob;
        returns what attach() restored and how the loop ended."""
        w, blob = np.zeros((4, 3), np.float32), []
        with session(d) as g:
            g.register_array("w", w)
            n = g.counter("n")
            g.register_blob("log", lambda: json.dumps(blob).encode(), lambda b: blob.extend(json.loads(b)))
            start = g.attach()
            restored = (start, n.value, list(blob), float(w[0, 0]))
            for step in g.steps(total):
                w += step
                n.value += step
                blob.append(step)
                if step == notify_at:
                    g.notify("test")
                time.sleep(0.002)  # the step's work
            return restored, g.stopped, g.exit_code, g.completed_steps, n.value, w

    def test_arrays_counters_blobs_restored_before_the_first_resumed_step(self):
        with TempDir() as d:
            restored, stopped, code, stop_step, _, _ = self.run_steps(d, FOREVER, notify_at=4)
            self.assertEqual(restored, (0, 0, [], 0.0))
            self.assertTrue(stopped)
            self.assertEqual(code, grace.RESTART)
            self.assertGreaterEqual(stop_step, 4)
            total = stop_step + 3
            tri = sum(range(1, stop_step + 1))
            restored, stopped, code, done, n, w = self.run_steps(d, total)
            self.assertEqual(restored, (stop_step, tri, list(range(1, stop_step + 1)), float(tri)))
            self.assertFalse(stopped)
            self.assertEqual((code, done, n), (0, total, sum(range(1, total + 1))))
            np.testing.assert_array_equal(w, np.full((4, 3), sum(range(1, total + 1)), np.float32))

    def test_finished_run_resumes_at_the_end(self):
        with TempDir() as d:
            w = np.arange(6, dtype=np.int64)
            with session(d) as g:
                g.register_array("w", w)
                g.attach()
                for _ in g.steps(3):
                    w *= 2
            w2 = np.zeros(6, np.int64)
            with session(d) as g:
                g.register_array("w", w2)
                self.assertEqual(g.attach(), 3)
                self.assertEqual(list(g.steps(3)), [])
            np.testing.assert_array_equal(w2, np.arange(6) * 8)
            np.testing.assert_array_equal(grace.load_numpy(os.path.join(d, "ck"))["w"], w2)

    def test_ctrl_c_is_a_notice_while_attached_and_keyboardinterrupt_after(self):
        with TempDir() as d:
            w = np.zeros(3, np.float32)
            with session(d) as g:
                g.register_array("w", w)
                g.attach()
                self.assertIn(signal.SIGINT, signal.pthread_sigmask(signal.SIG_BLOCK, []))  # the watcher takes it
                for step in g.steps(FOREVER):
                    if step == 2:
                        os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(0.001)  # KeyboardInterrupt would land here
                self.assertTrue(g.stopped)
                self.assertEqual(g.exit_code, grace.RESTART)
            self.assertTrue(any(c["valid"] for c in grace._grace.list_checkpoints(os.path.join(d, "ck"))))
            self.assertNotIn(signal.SIGINT, signal.pthread_sigmask(signal.SIG_BLOCK, []))  # mask put back
            with self.assertRaises(KeyboardInterrupt):  # Python's handler is back
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)

    def test_error_in_a_step_stops_with_the_fatal_code(self):
        with TempDir() as d:
            w = np.zeros(3, np.float32)
            g = session(d)
            with self.assertRaises(ZeroDivisionError):
                with g:
                    g.register_array("w", w)
                    g.attach()
                    for step in g.steps(10):
                        if step == 3:
                            1 / 0
            self.assertEqual(g.exit_code, grace.FATAL)
            self.assertIn("ZeroDivisionError", g.stop_reason)


class Gil(unittest.TestCase):
    def test_a_blocking_call_lets_other_python_threads_run(self):
        """finish() writes 256 MiB; a Python thread keeps ticking meanwhile
        (with the GIL held by finish() it could not tick at all)."""
        with TempDir() as d:
            w = np.ones(64 * 1024 * 1024, np.float32)
            ticks, stop = [], threading.Event()

            def count():
                while not stop.is_set():
                    ticks.append(time.monotonic_ns())
                    time.sleep(0.0005)

            with session(d) as g:
                g.register_array("w", w)
                g.attach()
                for _ in g.steps(1):
                    w += 1
                t = threading.Thread(target=count)
                t.start()
                while not ticks:
                    time.sleep(0.001)
                t0 = time.monotonic_ns()
                g.finish()
                t1 = time.monotonic_ns()
                stop.set()
                t.join()
            inside = sum(1 for x in ticks if t0 < x < t1)
            self.assertGreater(inside, 0, "no other Python thread ran during finish() (%.0f ms)" % ((t1 - t0) / 1e6))

    def test_a_notice_is_taken_while_python_holds_the_gil(self):
        """SIGTERM while the trainer thread holds the GIL for a second (a C
        call through ctypes.PyDLL keeps it): Grace's threads take the notice
        during that second, without the GIL; the stop comes at the next step
        boundary."""
        hold_gil_usleep = ctypes.PyDLL(None).usleep
        with TempDir() as d:
            w = np.zeros(3, np.float32)
            with session(d) as g:
                g.register_array("w", w)
                g.attach()
                before = len(events("notice"))
                os.kill(os.getpid(), signal.SIGTERM)
                hold_gil_usleep(1000000)
                t1 = time.time_ns()
                notices = events("notice")[before:]
                self.assertTrue(notices, "no notice taken while the GIL was held")
                self.assertLess(notices[0]["t_ns"], t1)
                for _ in g.steps(FOREVER):
                    pass
                self.assertTrue(g.stopped)
                self.assertEqual(g.exit_code, grace.RESTART)


class ShardedState(unittest.TestCase):
    def test_slice_saved_as_a_part_and_resliced_on_restore(self):
        """One rank's sharded checkpoint (its slice is the whole global
        tensor) restores into a smaller slice at an offset, and grace.load
        assembles the global tensor from the parts."""
        with TempDir() as d:
            m = np.arange(30, dtype=np.float32).reshape(10, 3)
            w = np.ones(4, np.float32)
            with session(d) as g:
                g.register_tensor("m", m, global_shape=[10, 3], offsets=[0, 0])
                g.register_array("w", w)
                g.attach()
                for _ in g.steps(2):
                    m += 1
            ck = grace.checkpoint_path(os.path.join(d, "ck"))
            index = json.load(open(os.path.join(ck, "model.safetensors.index.json")))
            self.assertEqual(index["grace_sharded"]["m"]["shape"], [10, 3])
            whole = grace.load_numpy(ck)
            np.testing.assert_array_equal(whole["m"], np.arange(30, dtype=np.float32).reshape(10, 3) + 2)
            np.testing.assert_array_equal(whole["w"], w)
            rows = np.zeros((4, 3), np.float32)
            with session(d) as g:
                g.register_tensor("m", rows, global_shape=[10, 3], offsets=[5, 0])
                g.register_array("w", np.zeros(4, np.float32))
                self.assertEqual(g.attach(), 2)
            np.testing.assert_array_equal(rows, whole["m"][5:9])

    PER_RANK_WORKER = """
import os, sys, time
import numpy as np
import grace
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
rows = 8 // world
m = np.zeros((rows, 2), np.float32)
tag = [b"none"]
g = grace.Session(sys.argv[2], save_every=5, exit_on_stop=False)
try:
    with g:
        g.register_tensor("m", m, global_shape=[8, 2], offsets=[rank * rows, 0])
        c = g.counter("cursor")
        g.register_blob("tag", lambda: tag[0], lambda b: tag.__setitem__(0, b))
        start = g.attach()
        print(f"RESTORED {rank} {world} {start} {c.value} {tag[0].decode()}", flush=True)
        for step in g.steps(int(sys.argv[1])):
            m += 1
            g.all_reduce_(np.ones(1, np.float32))  # in lockstep, as data-parallel training is
            c.value = 1000 * rank + step
            tag[0] = f"rank{rank}-step{step}".encode()
            if len(sys.argv) > 3 and rank == 1 and step == int(sys.argv[3]) and os.environ["GRACE_INCARNATION"] == "0":
                os.kill(os.getpid(), 9)  # lost: its part comes from its replica on rank 0
            time.sleep(0.01)
except grace.CollectiveError:
    sys.exit(g.exit_code)  # the peer's loss: the session saved just in time
"""

    def launch_per_rank(self, d, nproc, total, kill_at=None):
        extra = [kill_at] if kill_at else []
        rc, log = launch_script(self, d, self.PER_RANK_WORKER, nproc, [total, os.path.join(d, "ck")] + extra)
        self.assertEqual(rc, 0, log[-4000:])
        # Two workers share the pipe: a log line may land right after a
        # RESTORED line's last field, so fields are matched, not split.
        found = re.findall(r"RESTORED (\d+) (\d+) (\d+) (\d+) (none|rank\d+-step\d+)", log)
        return sorted(list(f) for f in found)

    @unittest.skipUnless(os.environ.get("GRACE_LAUNCH"), "needs grace-launch (GRACE_LAUNCH)")
    def test_each_rank_restores_its_own_counters_and_blobs(self):
        """Sharded state: every rank's part keeps its own counters and blobs;
        on another world size every rank takes the committer's (rank 0's)."""
        with TempDir() as d:
            self.launch_per_rank(d, 2, 12)
            self.assertEqual(self.launch_per_rank(d, 2, 14),
                             [["0", "2", "12", "12", "rank0-step12"], ["1", "2", "12", "1012", "rank1-step12"]])
            if os.environ.get("GRACE_CKPT"):  # grace-ckpt shows what differs per rank
                out = subprocess.run([os.environ["GRACE_CKPT"], "show", "--json", os.path.join(d, "ck")],
                                     capture_output=True, text=True, check=True)
                ranks = json.loads(out.stdout)["ranks"]
                self.assertEqual(list(ranks), ["1"])
                self.assertEqual(ranks["1"]["counters"], {"cursor": 1014})
            self.assertEqual(self.launch_per_rank(d, 1, 15), [["0", "1", "14", "14", "rank0-step14"]])

    @unittest.skipUnless(os.environ.get("GRACE_LAUNCH"), "needs grace-launch (GRACE_LAUNCH)")
    def test_a_lost_rank_restores_its_own_counters_and_blobs_from_its_replica(self):
        """Rank 1 SIGKILLed at step 9: the just-in-time save writes its part
        from the replica on rank 0, with rank 1's own counter and blob."""
        with TempDir() as d:
            lines = self.launch_per_rank(d, 2, 20, kill_at=9)
            resumed = [l for l in lines if l[2] != "0"]
            self.assertEqual(len(resumed), 2, lines)
            start = int(resumed[0][2])
            self.assertGreaterEqual(start, 7)  # at most two steps behind the loss
            self.assertEqual(resumed, [["0", "2", str(start), str(start), f"rank0-step{start}"],
                                       ["1", "2", str(start), str(1000 + start), f"rank1-step{start}"]])

    def test_bad_slices_are_value_errors(self):
        with TempDir() as d, session(d) as g:
            with self.assertRaisesRegex(ValueError, "outside the global shape"):
                g.register_tensor("a", np.zeros((4, 3), np.float32), global_shape=[5, 3], offsets=[2, 0])
            with self.assertRaisesRegex(ValueError, "number of dimensions"):
                g.register_tensor("b", np.zeros((4, 3), np.float32), global_shape=[12])
            with self.assertRaisesRegex(ValueError, "without global_shape"):
                g.register_tensor("c", np.zeros(3, np.float32), offsets=[1])


class BadInput(unittest.TestCase):
    def test_numpy(self):
        with TempDir() as d, session(d) as g:
            with self.assertRaisesRegex(ValueError, "not C-contiguous"):
                g.register_array("t", np.zeros((4, 4), np.float32).T)
            ro = np.zeros(3, np.float32)
            ro.setflags(write=False)
            with self.assertRaisesRegex(ValueError, "read-only"):
                g.register_array("ro", ro)
            with self.assertRaisesRegex(TypeError, "cannot be stored in safetensors"):
                g.register_array("c", np.zeros(3, np.complex64))
            with self.assertRaisesRegex(TypeError, "cannot be stored in safetensors"):
                g.register_array("be", np.zeros(3, ">f4"))
            with self.assertRaisesRegex(TypeError, "has no buffer"):
                g.register_array("list", [1, 2, 3])
            g.register_array("ok", np.zeros(3, np.float32))
            with self.assertRaisesRegex(ValueError, "registered already"):
                g.register_array("ok", np.zeros(3, np.float32))
            with self.assertRaisesRegex(grace.GraceError, "before attach"):
                g.steps(3)
            g.attach()
            with self.assertRaisesRegex(grace.GraceError, "after attach"):
                g.register_array("late", np.zeros(3, np.float32))
            with self.assertRaisesRegex(grace.GraceError, "after attach"):
                g.counter("late")
            with self.assertRaisesRegex(ValueError, "float32"):
                g.all_reduce_(np.zeros(3, np.float64))

    def test_checkpoint_that_does_not_match_is_an_error_and_stays_intact(self):
        with TempDir() as d:
            with session(d) as g:
                g.register_array("w", np.ones((4, 3), np.float32))
                g.attach()
                list(g.steps(2))
            ck = grace.checkpoint_path(os.path.join(d, "ck"))
            for name, arr, msg in [("w", np.zeros((3, 4), np.float32), "'w': expected F32 \\[3,4\\], checkpoint has F32 \\[4,3\\]"),
                                   ("w", np.zeros((4, 3), np.float64), "expected F64"),
                                   ("v", np.zeros(3, np.float32), "'v' is missing")]:
                with session(d) as g:
                    g.register_array(name, arr)
                    with self.assertRaisesRegex(grace.GraceError, msg):
                        g.attach()
                np.testing.assert_array_equal(arr, np.zeros_like(arr))  # nothing written into it
            grace.load_numpy(ck)  # still verifies

    def test_blob_limits_and_failures(self):
        with TempDir() as d:
            with session(d) as g:
                g.register_blob("big", lambda: b"x" * (grace.MAX_BLOB_BYTES + 1), lambda b: None)
                with self.assertRaisesRegex(grace.GraceError, "above the .*-byte limit"):
                    g.attach()
            with session(d) as g:
                g.register_array("w", np.zeros(2, np.float32))
                g.register_blob("b", lambda: b"1", lambda b: None)
                g.attach()
                list(g.steps(1))
            with session(d) as g:
                g.register_array("w", np.zeros(2, np.float32))
                g.register_blob("other", lambda: b"1", lambda b: None)
                with self.assertRaisesRegex(grace.GraceError, "no blob 'other'"):
                    g.attach()
            with session(d) as g:
                def broken(_):
                    raise ValueError("cannot take it")
                g.register_array("w", np.zeros(2, np.float32))
                g.register_blob("b", lambda: b"1", broken)
                with self.assertRaisesRegex(grace.GraceError, "restoring blob 'b'.*cannot take it"):
                    g.attach()

    def test_load_errors(self):
        with TempDir() as d:
            with self.assertRaisesRegex(grace.GraceError, "no such checkpoint"):
                grace.load_numpy(os.path.join(d, "nothing"))
            os.makedirs(os.path.join(d, "empty"))
            with self.assertRaisesRegex(grace.GraceError, "no a valid checkpoint|no valid"):
                grace.load_numpy(os.path.join(d, "empty"))


class TorchBadInput(unittest.TestCase):
    def test_tensors(self):
        with TempDir() as d, session(d) as g:
            with self.assertRaisesRegex(ValueError, "not contiguous"):
                g.register_tensor("t", torch.zeros(4, 4).t())
            with self.assertRaisesRegex(ValueError, "is on meta"):
                g.register_tensor("m", torch.zeros(4, device="meta"))
            with self.assertRaisesRegex(TypeError, "complex64, which safetensors cannot hold"):
                g.register_tensor("c", torch.zeros(4, dtype=torch.complex64))
            with self.assertRaisesRegex(ValueError, "sparse"):
                g.register_tensor("s", torch.zeros(4, 4).to_sparse())
            with self.assertRaisesRegex(ValueError, "negated"):
                g.register_tensor("n", torch.zeros(4)._neg_view())
            t = torch.zeros(4)
            g.register_tensor("t", t)
            t.data = torch.ones(4)  # moved: Grace would save memory the trainer no longer uses
            g.attach()
            with self.assertRaisesRegex(grace.GraceError, "'t' moved since it was registered"):
                g.steps(2)
            with self.assertRaisesRegex(ValueError, "float32 CPU tensor"):
                g.all_reduce_(torch.zeros(3, dtype=torch.float64))
            with self.assertRaisesRegex(ValueError, "not contiguous"):
                g.all_reduce_(torch.zeros(3, 3).t())

    def test_model_that_does_not_match(self):
        with TempDir() as d:
            with session(d) as g:
                g.register_module(nn.Linear(4, 3))
                g.attach()
                list(g.steps(1))
            other = nn.Linear(4, 5)
            before = {k: v.clone() for k, v in other.state_dict().items()}
            with session(d) as g:
                g.register_module(other)
                with self.assertRaisesRegex(grace.GraceError, "'model.weight': expected F32 \\[5,4\\], checkpoint has F32 \\[3,4\\]"):
                    g.attach()
            for k, v in other.state_dict().items():
                self.assertTrue(torch.equal(v, before[k]))


class AttachRefused(unittest.TestCase):
    """A worker whose attach() fails for a reason that is not bad input
    stops with grace-train's code, not with a traceback (exit 1), which the
    launcher would take for a bug and stop the job."""

    SCRIPT = ("import grace, numpy as np; a = np.zeros(4, dtype=np.float32)\n"
              "with grace.Session(sys_dir, exit_on_stop=EXIT, connect_timeout_ms=1000) as g:\n"
              "    g.register_array('a', a)\n"
              "    try:\n"
              "        g.attach()\n"
              "    except grace.GraceError as e:\n"
              "        print('raised', g._s.attach_exit_code)\n")

    def run_worker(self, exit_on_stop):
        import socket
        import subprocess
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there: the coordination service is unreachable
        d = tempfile.mkdtemp(prefix="grace-py-refused-")
        env = dict(os.environ, GRACE_RANK="1", GRACE_WORLD_SIZE="2", GRACE_COORDINATOR="127.0.0.1:%d" % port,
                   GRACE_RUN_ID="refused", GRACE_TOKEN="0123456789abcdef0123456789abcdef", GRACE_INCARNATION="0")
        script = self.SCRIPT.replace("sys_dir", repr(d)).replace("EXIT", repr(exit_on_stop))
        try:
            return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                  timeout=120)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_unreachable_coordinator_exits_45_without_a_traceback(self):
        p = self.run_worker(True)
        self.assertEqual(p.returncode, 45, p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertIn("exiting with 45", p.stderr)

    def test_without_exit_on_stop_it_raises_and_names_the_code(self):
        p = self.run_worker(False)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.splitlines()[-1].split(), ["raised", "45"])  # after Grace's log lines


class IndexData(torch.utils.data.Dataset):
    """Sample i is i: what a step took says which samples it saw."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return i


class ResumableData(unittest.TestCase):
    """grace.data.ResumableLoader with two prefetching workers: a run
    stopped by a notice and resumed sees exactly the samples, in the order,
    of an uninterrupted run (each sample once per epoch), although the
    workers had drawn batches ahead when it stopped."""

    def run_steps(self, d, seen, total, notify_at=None):
        loader = grace.data.ResumableLoader(IndexData(), 4, seed=3, num_workers=2)
        with session(d) as g:
            g.register_stateful("loader", loader)
            g.attach()
            loader.place(g.rank, g.world_size)
            batches = loader.batches()
            for step in g.steps(total):
                seen[step] = next(batches).tolist()
                if step == notify_at:
                    g.notify("test")
                time.sleep(0.01)  # the workers prefetch meanwhile
            return g.completed_steps

    def test_a_restart_sees_every_sample_once_in_the_uninterrupted_order(self):
        with TempDir() as ref, TempDir() as d:
            expected, seen = {}, {}
            self.run_steps(ref, expected, 25)
            epochs = [sum((expected[s] for s in range(1 + 10 * e, 11 + 10 * e)), []) for e in (0, 1)]
            self.assertEqual([sorted(e) for e in epochs], [list(range(40))] * 2)
            self.assertNotEqual(epochs[0], epochs[1])  # a new permutation every epoch
            stopped = self.run_steps(d, seen, FOREVER, notify_at=6)
            self.assertGreaterEqual(stopped, 6)
            self.assertEqual(sorted(seen), list(range(1, stopped + 1)))
            self.assertEqual(self.run_steps(d, seen, 25), 25)
            self.assertEqual(seen, expected)

    def test_a_restore_during_an_iteration_goes_on_from_the_restored_batch(self):
        """What a recovery in place does: load_state_dict while batches() is
        being iterated, mid-epoch and after the epoch's last batch."""
        def loader():
            return grace.data.ResumableLoader(IndexData(), 4, seed=3, num_workers=2)
        it = loader().batches()
        first = [next(it).tolist() for _ in range(12)]  # 10 batches an epoch
        for taken in (5, 10):  # mid-epoch; right after the epoch's last batch
            l = loader()
            it = l.batches()
            for _ in range(taken):
                next(it)
            # Back to before the last batch taken, as a recovery in place does.
            l.load_state_dict(dict(l.state_dict(), epoch=(taken - 1) // 10, batch=(taken - 1) % 10))
            self.assertEqual(next(it).tolist(), first[taken - 1])
            self.assertEqual(next(it).tolist(), first[taken])

    def test_a_loader_of_another_configuration_is_refused(self):
        with TempDir() as d:
            self.run_steps(d, {}, 3)
            loader = grace.data.ResumableLoader(IndexData(), 8, seed=3)
            with session(d) as g:
                g.register_stateful("loader", loader)
                with self.assertRaisesRegex(grace.GraceError, "global_batch 4 and seed 3, this one 8 and 3"):
                    g.attach()

    def test_state_that_is_not_json_is_pickled(self):
        class Tracker:
            def __init__(self):
                self.seen = set()

            def state_dict(self):
                return {"seen": self.seen, "pair": (1, 2), 7: "int key"}

            def load_state_dict(self, s):
                self.seen = s["seen"]
                self.pair = s["pair"]
                self.key = s[7]

        with TempDir() as d:
            t = Tracker()
            with session(d) as g:
                g.register_stateful("tracker", t)
                g.attach()
                for step in g.steps(3):
                    t.seen.add(step)
            t = Tracker()
            with session(d) as g:
                g.register_stateful("tracker", t)
                self.assertEqual(g.attach(), 3)
            self.assertEqual((t.seen, t.pair, t.key), ({1, 2, 3}, (1, 2), "int key"))
        # JSON-able but not kept by JSON (a tuple, an int key): pickled too.
        self.assertEqual(grace.state.decode_state(grace.state.encode_state({1: (2, 3)})), {1: (2, 3)})
        self.assertEqual(grace.state.encode_state({"a": [1]}), b'{"a": [1]}')


class StopsAreExceptions(unittest.TestCase):
    """Two workers under grace-launch with no `with` block: a stop raises
    grace.Preempted (finally blocks and atexit handlers run, exit 42, the
    group restarts and finishes); a peer's SIGKILL makes all_reduce_ raise a
    CollectiveError that nothing catches, and the excepthook still takes
    the just-in-time path (exit 42, not a fatal 1); a trainer that swallows
    Preempted is ended by the stop deadline with exit 42. A SIGTERM handler
    installed before the session and an on_notice callback both run on the
    rank that received the signal."""

    WORKER = """
import atexit, os, signal, sys, time
import numpy as np
import grace
mode, out = sys.argv[1], sys.argv[2]
rank, inc = int(os.environ["RANK"]), os.environ["GRACE_INCARNATION"]
def mark(what):
    open(os.path.join(out, "%s-%s-%d" % (what, inc, rank)), "w").close()
atexit.register(mark, "atexit")
signal.signal(signal.SIGTERM, lambda signum, frame: mark("handler%d" % signum))  # a framework's, before Grace
w = np.zeros(4, np.float32)
g = grace.Session(os.path.join(out, "ck"), stop_deadline_ms=1500)
g.on_notice(lambda source, detail: mark("notice%s%s" % (source, detail)))
g.register_array("w", w)
g.attach()
try:
    for step in g.steps(30):
        if inc == "0" and rank == 1 and step == 10:  # rank 0 is in step 10 too: its collective must fail
            os.kill(os.getpid(), signal.SIGKILL if mode == "kill" else signal.SIGTERM)
        time.sleep(0.01)
        grad = np.ones(4, np.float32)
        grace.all_reduce_(grad)
        w += grad
    g.finish()
except grace.Preempted as e:
    mark("preempted%d" % e.code)
    while mode == "swallow":
        time.sleep(0.1)  # caught and never left: the stop deadline ends the process
    raise
finally:
    mark("finally")
"""

    def launch(self, d, mode):
        rc, log = launch_script(self, d, self.WORKER, 2, [mode, d])
        self.assertEqual(rc, 0, log[-4000:])
        self.assertEqual(grace.load(os.path.join(d, "ck"))["w"].tolist(), [60.0] * 4)  # 30 steps of 2
        marks = sorted(n for n in os.listdir(d) if n[0] in "afhnp")
        return marks, log

    FINISHED = ["atexit-1-0", "atexit-1-1", "finally-1-0", "finally-1-1"]
    NOTICED = ["handler15-0-1", "noticesignalSIGTERM-0-1"]  # rank 1 received the SIGTERM

    @unittest.skipUnless(os.environ.get("GRACE_LAUNCH"), "needs grace-launch (GRACE_LAUNCH)")
    def test_a_notice_raises_preempted_and_teardown_runs(self):
        with TempDir() as d:
            marks, _ = self.launch(d, "notice")
            self.assertEqual(marks, ["atexit-0-0", "atexit-0-1"] + self.FINISHED[:2] +
                             ["finally-0-0", "finally-0-1"] + self.FINISHED[2:] + self.NOTICED +
                             ["preempted42-0-0", "preempted42-0-1"])

    @unittest.skipUnless(os.environ.get("GRACE_LAUNCH"), "needs grace-launch (GRACE_LAUNCH)")
    def test_an_uncaught_collective_error_takes_the_just_in_time_path(self):
        with TempDir() as d:
            marks, log = self.launch(d, "kill")
            self.assertEqual(marks, ["atexit-0-0"] + self.FINISHED[:2] + ["finally-0-0"] + self.FINISHED[2:])
            self.assertIn("CollectiveError", log)
            self.assertNotIn("Traceback", log)
            self.assertIn("restart 1/", log)

    @unittest.skipUnless(os.environ.get("GRACE_LAUNCH"), "needs grace-launch (GRACE_LAUNCH)")
    def test_a_swallowed_stop_still_ends_the_process_with_its_code(self):
        with TempDir() as d:
            marks, log = self.launch(d, "swallow")
            self.assertEqual(marks, self.FINISHED + self.NOTICED + ["preempted42-0-0", "preempted42-0-1"])
            self.assertIn("stop_deadline_ms", log)
            self.assertIn("restart 1/", log)


class InPlace(unittest.TestCase):
    """grace-launch --recovery in-place with Session(recover_in_place=True):
    rank 2 SIGKILLed at step 10, a replacement takes its place and the two
    survivors keep their processes. With the should_commit() check every
    step is applied exactly once (w = 3 per step); a trainer that skips the
    check is stopped (exit 3) instead of applying a half-reduced sum."""

    WORKER = """
import os, signal, sys, time
import numpy as np
import grace
mode, out = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
w = np.zeros(4, np.float32)
g = grace.Session(os.path.join(out, "ck"), recover_in_place=True)
g.register_array("w", w)
g.attach()
for step in g.steps(30):
    if rank == 2 and step == 10 and not os.environ.get("GRACE_REPLACEMENT"):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.01)
    grad = np.ones(4, np.float32)
    grace.all_reduce_(grad)
    if mode == "check" and not g.should_commit():
        continue
    w += grad
g.finish()
print("RECOVERED rank %d pid %d: %d" % (rank, os.getpid(), g.recoveries), flush=True)
"""

    def launch(self, d, mode):
        return launch_script(self, d, self.WORKER, 3, [mode, d], ["--recovery", "in-place"])

    @unittest.skipUnless(os.environ.get("GRACE_LAUNCH"), "needs grace-launch (GRACE_LAUNCH)")
    def test_survivors_keep_their_processes_and_every_step_counts_once(self):
        with TempDir() as d:
            rc, log = self.launch(d, "check")
            self.assertEqual(rc, 0, log[-3000:])
            self.assertEqual(grace.load(os.path.join(d, "ck"))["w"].tolist(), [90.0] * 4)
            recovered = sorted(re.findall(r"RECOVERED rank (\d) pid \d+: (\d)", log))
            self.assertEqual(recovered, [("0", "1"), ("1", "1"), ("2", "1")], log[-3000:])
            self.assertNotIn("restart 1/", log)

    @unittest.skipUnless(os.environ.get("GRACE_LAUNCH"), "needs grace-launch (GRACE_LAUNCH)")
    def test_a_step_that_never_asks_should_commit_is_stopped(self):
        with TempDir() as d:
            rc, log = self.launch(d, "no-check")
            self.assertEqual(rc, 3, log[-3000:])
            self.assertIn("never asked g.should_commit()", log)


class Standby(unittest.TestCase):
    """A warm spare of grace-launch --standby waits at `import grace`, and
    the script goes on with os.environ holding what the launcher sent."""

    SCRIPT = ("import os, sys; os.environ['WORKER_VAR'] = 'stale'; import grace; "
              "print(os.environ.get('WORKER_VAR'), os.environ.get('GRACE_STANDBY_FD'), "
              "os.getenv('MASTER_PORT'))")

    def spare(self):
        import socket
        import subprocess
        ours, theirs = socket.socketpair()
        env = dict(os.environ, GRACE_STANDBY_FD=str(theirs.fileno()))
        p = subprocess.Popen([sys.executable, "-c", self.SCRIPT], env=env, pass_fds=[theirs.fileno()],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        theirs.close()
        ours.settimeout(60)
        self.assertEqual(ours.recv(1), b"R")  # ready: it reached `import grace`
        return ours, p

    def test_released_spare_goes_on_with_the_workers_environment(self):
        ours, p = self.spare()
        ours.sendall(b"WORKER_VAR=released\0MASTER_PORT=29777\0\0")
        ours.close()
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, err)
        self.assertEqual(out.split(), ["released", "None", "29777"])

    def test_spare_not_needed_exits_0_without_running_on(self):
        ours, p = self.spare()
        ours.close()
        out, err = p.communicate(timeout=60)
        self.assertEqual((p.returncode, out), (0, ""), err)

    def test_malformed_release_is_a_grace_error(self):
        ours, p = self.spare()
        ours.sendall(b"NOEQUALS\0\0")
        ours.close()
        out, err = p.communicate(timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("GraceError", err)
        self.assertIn("NOEQUALS", err)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.2)
        self.b = nn.Linear(16, 4)
        self.register_buffer("seen", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        return self.b(self.drop(torch.relu(self.a(x))))


def train(d, total, stop_at=None, amsgrad=False):
    """Trains from the checkpoint in d (if any) towards `total` steps; a
    notice at `stop_at` (0: before the first step) stops it wherever the
    agreement lands. Returns (model, optimizer, stopped, completed)."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, amsgrad=amsgrad)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    with session(d) as g:
        g.register_module(model)
        g.register_optimizer(opt)
        g.register_rng()
        g.register_stateful("sched", sched)
        g.attach()
        if stop_at == 0:
            # Agreed before step 1 starts: the checkpoint is taken at step 0,
            # before the optimizer ever stepped (its state is still lazy).
            agreed = len(events("agreed"))
            g.notify("before the first step")
            for _ in range(1000):
                if len(events("agreed")) > agreed:
                    break
                time.sleep(0.01)
        for step in g.steps(total):
            x = torch.randn(5, 8)
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            model.seen += 1
            if step == stop_at:
                g.notify("test")
            if stop_at is not None:
                time.sleep(0.002)  # leaves the notice time to land before `total`
        return model, opt, g.stopped, g.completed_steps


def state_bytes(model, opt):
    out = {k: v.clone() for k, v in model.state_dict().items()}
    sd = opt.state_dict()
    for i, st in sd["state"].items():
        for k, v in st.items():
            out["opt.%d.%s" % (i, k)] = v.clone() if torch.is_tensor(v) else v
    out["groups"] = json.dumps([{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]])
    return out


class TorchTraining(unittest.TestCase):
    def assert_same(self, a, b):
        self.assertEqual(sorted(a), sorted(b))
        for k in a:
            if torch.is_tensor(a[k]):
                self.assertEqual(a[k].dtype, b[k].dtype, k)
                self.assertTrue(torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8)), k)
            else:
                self.assertEqual(a[k], b[k], k)

    def check_resume(self, stop_at, amsgrad=False):
        """Stopped by a notice at `stop_at`, resumed: the end state equals an
        uninterrupted run's, byte for byte (model, optimizer, scheduler)."""
        total = 40
        with TempDir() as ref, TempDir() as d:
            m, o, _, _ = train(ref, total, amsgrad=amsgrad)
            want = state_bytes(m, o)
            _, _, stopped, at = train(d, total, stop_at=stop_at, amsgrad=amsgrad)
            self.assertTrue(stopped, "the notice must stop the run before step %d" % total)
            m2, o2, stopped, done = train(d, total, amsgrad=amsgrad)
            self.assertEqual((stopped, done), (False, total))
            self.assert_same(want, state_bytes(m2, o2))
            return at

    def test_resume_mid_run_is_bit_identical(self):
        self.check_resume(5)

    def test_resume_after_the_first_step_is_bit_identical(self):
        self.check_resume(1, amsgrad=True)

    def test_stop_before_the_first_step_keeps_lazy_state_lazy(self):
        self.assertEqual(self.check_resume(0), 0)

    def test_load_without_the_runtime(self):
        with TempDir() as d:
            model, opt, _, _ = train(d, 6)
            ck = os.path.join(d, "ck")
            fresh = Net()
            fresh.load_state_dict(grace.load(ck, prefix="model."))
            for k, v in model.state_dict().items():
                self.assertTrue(torch.equal(v, fresh.state_dict()[k]), k)
            opt2 = torch.optim.AdamW(fresh.parameters(), lr=1.0)
            opt2.load_state_dict(grace.optimizer_state_dict(ck))
            self.assert_same(state_bytes(model, opt), state_bytes(fresh, opt2))
            arrays = grace.load_numpy(ck)
            self.assertIn("optimizer.state.0.exp_avg", arrays)
            self.assertEqual(grace.read_manifest(ck)["step"], 6)

    def test_bfloat16_and_small_dtypes_round_trip(self):
        with TempDir() as d:
            ts = {"bf": torch.randn(3, 2).bfloat16(), "h": torch.randn(5).half(), "b": torch.tensor([True, False]),
                  "i8": torch.tensor([-3, 4], dtype=torch.int8), "s": torch.tensor(7.5)}
            with session(d) as g:
                for k, v in ts.items():
                    g.register_tensor(k, v)
                g.attach()
                list(g.steps(1))
            back = grace.load(os.path.join(d, "ck"))
            for k, v in ts.items():
                self.assertEqual(back[k].dtype, v.dtype)
                self.assertTrue(torch.equal(back[k], v), k)
            with self.assertRaisesRegex(grace.GraceError, "bfloat16"):
                grace.load_numpy(os.path.join(d, "ck"))


if __name__ == "__main__":
    try:
        unittest.main(verbosity=2)
    finally:
        if os.path.exists(EVENTS):
            os.unlink(EVENTS)
