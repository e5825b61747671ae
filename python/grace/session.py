"""grace.Session: the embedding API (actors/session.hpp) with Python idioms.

Stops are exceptions. When the session stops (a notice, a lost peer, an
error on another rank), the next step boundary raises grace.Preempted (exit
code 42: restart me) or grace.Stopped (any other code), both SystemExit
subclasses: `finally` blocks, context managers and atexit handlers run, and
the interpreter exits with the code grace-launch reads. If the trainer
catches it, or its teardown hangs, the process still ends with that code
stop_deadline_ms later. An exception that escapes the training code with
no `with` block around it (sys.excepthook) still ends in the agreed or
just-in-time path: a collective's failure (grace.CollectiveError, or
torch.distributed's Gloo/NCCL errors) waits for the coordinator's verdict
and exits 42; any other error stops every rank with exit 3, as inside a
`with` block.

Signals: a Session blocks SIGTERM and SIGINT in the thread that creates it
(create it in the main thread, before starting threads of your own), and
attach() starts Grace's signal watcher, which takes both. From then until
close(), Ctrl-C and SIGTERM are preemption notices: the workers agree on a
step, save it and exit with the restart code. Python's KeyboardInterrupt
does not happen meanwhile. Handlers are shared, not lost: a Python handler
for SIGTERM or SIGINT installed before the Session (a framework's: Lightning,
accelerate, submitit) is chained, called as handler(signum, None) on the
trainer thread at the next step boundary after the signal; code of your own
registers g.on_notice(callback) the same way. A handler installed with
signal.signal() while the session is open would take the signals away from
Grace: install it before, or use on_notice. close() (the end of the `with`
block) puts Python's handlers back.
"""
import atexit
import contextlib
import os
import signal
import sys
import traceback

from . import _grace
from . import state as _state
from ._grace import CollectiveError, GraceError

_current = None


_stop_code = None  # set once Grace raised a stop: the exit code the process ends with


class Stopped(SystemExit):
    """The session stopped: leave, and exit with `code` (what grace-launch
    reads). `reason` says why (the notice, the lost rank, the error)."""

    def __init__(self, code, reason=""):
        global _stop_code
        super().__init__(code)
        self.reason = reason
        _stop_code = code

    def __str__(self):
        return "grace stopped the session with exit code %s: %s" % (self.code, self.reason)


class Preempted(Stopped):
    """A stop to be restarted from the saved step (exit code 42 by default):
    a preemption notice, a lost peer (after the just-in-time save)."""


_grace._set_stop_classes(Stopped, Preempted)


def _end_after_stop():
    """Registered at `import grace`, so it runs after the atexit handlers
    registered later (the trainer's): once a stop was raised, the process
    ends here with its code. What is left is the interpreter's own teardown
    of native objects (torch, DataLoader workers, Grace's threads), which a
    stopped worker does not need and which must not turn exit 42 into an
    abort."""
    if _stop_code is None:
        return
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    os._exit(int(_stop_code))


atexit.register(_end_after_stop)

# What torch.distributed's Gloo and NCCL groups raise when a peer is lost or
# its connections are shut down (torch 1.13 raises plain RuntimeErrors).
_COLLECTIVE_MARKERS = ("gloo", "nccl", "connection closed by peer", "connection reset by peer", "broken pipe",
                       "processgroup", "timed out in call to")


def is_collective_failure(exc):
    """Whether an exception is a failed collective (a peer lost, a group
    aborted) rather than a bug in the step."""
    if isinstance(exc, CollectiveError):
        return True
    if type(exc).__name__ in ("DistBackendError", "DistNetworkError"):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(m in text for m in _COLLECTIVE_MARKERS)


def current():
    """The attached session of this process (None before attach)."""
    return _current


def all_reduce_(t):
    """In-place sum of a float32 CPU tensor (or numpy array) over every worker,
    through the current session's abortable Gloo ring."""
    if _current is None:
        raise GraceError("grace.all_reduce_ before a session's attach()")
    return _current.all_reduce_(t)


def _socket_fds():
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + name).startswith("socket:"):
                fds.add(int(name))
        except OSError:
            pass  # closed meanwhile (the listing's own fd)
    return fds


class Session:
    """One worker's Grace session.

    checkpoint_dir: default $GRACE_CHECKPOINT_DIR (grace-launch sets it from
    --checkpoint-dir), else "grace-checkpoints". save_every: periodic
    checkpoint every N steps (0: off), or "auto": Daly's interval for the
    measured save cost and the failure history grace-launch keeps beside the
    checkpoints (mtbf_prior_hours until failures are seen). A periodic save
    that fails is a warning: training goes on and it is retried after 1 s,
    doubling up to save_retry_max_ms; prune_on_save_failure removes every
    checkpoint but the newest that verifies before a retry. fallback_checkpoint_dir: where a
    preemption, final or just-in-time save goes when checkpoint_dir cannot take it (a restart
    restores the newest of both). grace_period_ms: time from a notice to
    the kill (0: save and exit at once). exit_on_stop: when the session stops
    (a notice, a lost peer, an error elsewhere), raise grace.Preempted or
    grace.Stopped (SystemExit with its exit code, 42: restart me) at the step
    boundary; False leaves the loop instead, and the caller exits with
    g.exit_code. stop_deadline_ms: after that exception, the process ends
    with the code within this time whatever the code around it does (0:
    never forced). recover_in_place: under `grace-launch --recovery
    in-place`, a lost peer is replaced while this process keeps running: the
    grace.all_reduce_ that failed returns after the group formed again, the
    step is abandoned (blobs such as RNG states and the loader's position
    are put back to the last completed step) and runs again; the step must
    skip its update when g.should_commit() is False (Grace's all_reduce_
    only: a torch.distributed group is not formed again). collective_timeout_ms bounds the rendezvous and every
    all_reduce_ (a lost peer aborts one at once). connect_timeout_ms: how long
    attach() tries to reach the coordination service before it stops with
    exit code 45. replicas: with sharded
    tensors on several ranks, every rank keeps in memory copies of its part
    and a replica of one other rank's, so a lost rank still ends in a
    just-in-time save (False: back to the last periodic checkpoint).
    """

    def __init__(self, checkpoint_dir=None, *, save_every=0, save_every_seconds=0.0, keep_last=3,
                 keep_checkpoints_on_success=False, grace_period_ms=0, notice_file=None, notice_command=None,
                 poll_interval_ms=1000, restart_exit_code=None, exit_on_stop=True, wait_timeout_ms=60000,
                 heartbeat_ms=200, dead_after_ms=3000, collective_timeout_ms=30000, mtbf_prior_hours=6.0,
                 save_retry_max_ms=300000, prune_on_save_failure=False, fallback_checkpoint_dir=None,
                 replicas=True, connect_timeout_ms=30000, stop_deadline_ms=10000, recover_in_place=False):
        checkpoint_dir = checkpoint_dir or os.environ.get("GRACE_CHECKPOINT_DIR") or "grace-checkpoints"
        if restart_exit_code is None:
            restart_exit_code = int(os.environ.get("GRACE_RESTART_CODE", _grace.RESTART))
        self.exit_on_stop = exit_on_stop
        self._restart_code = restart_exit_code
        self._s = _grace.Session(
            exit_on_stop=exit_on_stop, collective_timeout_ms=collective_timeout_ms,
            stop_deadline_ms=int(stop_deadline_ms), recover_in_place=bool(recover_in_place),
            checkpoint_dir=str(checkpoint_dir), keep_last=keep_last, restart_exit_code=restart_exit_code,
            save_every_steps=0 if save_every == "auto" else save_every, save_every_auto=save_every == "auto",
            mtbf_prior_seconds=float(mtbf_prior_hours) * 3600, save_every_seconds=save_every_seconds,
            save_retry_max_ms=save_retry_max_ms, prune_on_save_failure=prune_on_save_failure,
            fallback_checkpoint_dir=str(fallback_checkpoint_dir or ""),
            keep_checkpoints_on_success=keep_checkpoints_on_success, notice_file=notice_file,
            notice_command=notice_command, poll_interval_ms=poll_interval_ms, grace_period_ms=grace_period_ms,
            wait_timeout_ms=wait_timeout_ms, heartbeat_ms=heartbeat_ms, dead_after_ms=dead_after_ms,
            replicas=bool(replicas), connect_timeout_ms=connect_timeout_ms)
        self.checkpoint_dir = str(checkpoint_dir)
        self._chain_signal_handlers()
        self._checks = []       # callables raising GraceError when registered memory moved
        self._after_attach = []  # callables(restored_step)
        self._blobs = []        # (name, save) for the size check at attach
        self._hook = None       # the sys.excepthook this session replaced while attached

    def _chain_signal_handlers(self):
        """The Python handlers of SIGTERM/SIGINT in place before Grace takes
        the signals, called at the step boundary after such a signal."""
        chained = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            h = signal.getsignal(signum)
            if callable(h) and h is not signal.default_int_handler:
                chained[signal.Signals(signum).name] = (int(signum), h)
        if chained:
            def chain(source, detail):
                if source == "signal" and detail in chained:
                    signum, handler = chained[detail]
                    handler(signum, None)
            self._s.on_notice(chain)

    def on_notice(self, callback):
        """callback(source, detail) for every preemption notice this process
        receives itself (source "signal" with detail "SIGTERM"/"SIGINT",
        "file", "command" or "callback"), run on the trainer thread at the
        next step boundary, before Grace saves and stops. For work a notice
        should start at once (flush an experiment tracker, tell a scheduler);
        keep it short: it runs inside the grace period. An exception in it
        is reported and does not stop the save."""
        self._s.on_notice(callback)

    # ------------------------------------------------------------ registering

    def register_tensor(self, name, t, global_shape=None, offsets=None):
        """A torch CPU tensor or a numpy array, registered by its memory: Grace
        copies it at a checkpoint and writes into it on restore. It must stay
        the tensor the trainer uses (no `.data =`, no `.to()` afterwards).

        Sharded state (ZeRO/FSDP): `t` is this rank's slice of a global tensor
        of `global_shape`, starting at `offsets` (default: the origin). Every
        rank then writes its own part of each checkpoint, and a restore on any
        number of ranks fills each rank's slice from the stored parts."""
        gs = [int(d) for d in global_shape] if global_shape is not None else []
        off = [int(o) for o in offsets] if offsets is not None else []
        if _state.is_torch_tensor(t):
            dtype, shape, ptr, owner = _state.tensor_memory(name, t)
            self._s.register_memory(name, dtype, shape, ptr, owner, gs, off)
            self._checks.append(_state.pointer_check(name, t, ptr))
        else:
            self._s.register_buffer(name, t, gs, off)

    register_array = register_tensor

    def register_module(self, module, prefix="model."):
        """Every parameter and persistent buffer of an nn.Module, named
        prefix + its state_dict() key. Returns the names."""
        names = []
        for key, t in module.state_dict(keep_vars=True).items():
            self.register_tensor(prefix + key, t)
            names.append(prefix + key)
        return names

    def register_optimizer(self, optimizer, prefix="optimizer."):
        """A torch.optim optimizer's state: tensors by memory, named
        prefix + "state.<i>.<key>" as in optimizer.state_dict(); its Python
        numbers and param_groups (lr, betas...) in a blob. State that torch
        creates lazily at the first step is created now (one step with zero
        gradients, parameters and gradients put back) so a restore has memory
        to fill; on a fresh start torch's own first step initialises it and
        Grace adopts it (see grace/state.py). Returns the tensor names."""
        return _state.register_optimizer(self, optimizer, prefix)

    def register_rng(self, prefix="rng.", torch=True, numpy=True, python=True):
        """The global RNG states (torch CPU, numpy, Python's random) as blobs.
        Saved from the saving worker: keep them identical on every worker
        (same seed, same draws) or derive per-worker streams from the step."""
        _state.register_rng(self, prefix, torch, numpy, python)

    def register_stateful(self, name, obj):
        """An object with state_dict() / load_state_dict() whose state is
        small (a data loader's position, a scheduler): saved as a blob, JSON
        when it is JSON, else pickled."""
        _state.register_stateful(self, name, obj)

    def register_blob(self, name, save, restore, snapshot=None):
        """A small byte string (at most grace.MAX_BLOB_BYTES), restored by
        restore(bytes) in attach(). Without `snapshot`, save() -> bytes runs
        at every step boundary; with it, snapshot() -> object runs there (keep
        it cheap: a copy of the state) and save(object) -> bytes only at a
        checkpoint. Either way a checkpoint, a just-in-time one after a failed
        step included, holds the state as of the last completed step."""
        if snapshot is None:
            snapshot, save = save, None
        self._s.register_blob(name, snapshot, save, restore)
        self._blobs.append((name, snapshot, save))

    def counter(self, name, initial=0):
        """An int64 saved with every checkpoint; use its .value."""
        return self._s.counter(name, initial)

    # ---------------------------------------------------------------- running

    def attach(self):
        """Joins the cluster and restores the newest valid checkpoint (blobs
        and counters included). Returns the number of completed steps. Bad
        input (a checkpoint that does not match, a bad configuration) raises
        GraceError. A join the cluster refuses for now (the group lost a
        member and is stopping) exits with the restart code, an unreachable
        coordination service with 45 (no rendezvous), as grace-train does;
        with exit_on_stop=False they raise GraceError too."""
        global _current
        for name, snapshot, save in self._blobs:
            n = len(bytes(save(snapshot()) if save else snapshot()))
            if n > _grace.MAX_BLOB_BYTES:
                raise GraceError("blob '%s' is %d bytes, above the %d-byte limit for manifest blobs: "
                                 "register it as a tensor" % (name, n, _grace.MAX_BLOB_BYTES))
        try:
            start = self._s.attach()
        except GraceError as e:
            # Not bad input: the coordination service unreachable, or this
            # group refused (it lost a member and is stopping). A worker
            # stops with the code grace-train uses (restart, or no
            # rendezvous), not with a traceback the launcher reads as a bug.
            code = self._s.attach_exit_code
            if code is None or not self.exit_on_stop:
                raise
            print("grace: %s; exiting with %d" % (e, code), file=sys.stderr, flush=True)
            raise SystemExit(code)
        for hook in self._after_attach:
            hook(start)
        _current = self
        if self.exit_on_stop:
            self._hook = sys.excepthook
            sys.excepthook = self._uncaught
            atexit.register(self.close)
        return start

    def _uncaught(self, exc_type, exc, tb):
        """sys.excepthook while attached: an exception no `with` block saw
        ends in Grace's path (as __exit__ does), then the process exits with
        the stop's code after the atexit handlers ran."""
        hook = self._hook or sys.__excepthook__
        if issubclass(exc_type, SystemExit) or not self._failing_step_is_ours():
            return hook(exc_type, exc, tb)
        code = self._report_failure(exc_type, exc, tb, hook)
        self.close()
        try:
            atexit._run_exitfuncs()
        finally:
            self._s.quick_exit(code)

    def _failing_step_is_ours(self):
        return self._s.attached and not self._s.closed and not self._s.stopped and not self._s.finished

    def _report_failure(self, exc_type, exc, tb, print_hook):
        """An exception out of the training code: Grace's verdict (a failed
        collective waits for the coordinator, anything else stops every
        rank), printed; returns the exit code."""
        collective = is_collective_failure(exc)
        code = self._s.fail_step("%s: %s" % (exc_type.__name__, exc), collective)
        if collective:
            print("grace: %s: %s; %s" % (exc_type.__name__, exc, self._s.stop_reason), file=sys.stderr, flush=True)
        else:
            print_hook(exc_type, exc, tb)
        return code

    def steps(self, total):
        """Iterates over the steps still to run, completed_steps + 1 .. total.
        At each step boundary Grace handles what is pending; when the session
        stops, the process exits with the stop's code (exit_on_stop), or the
        loop ends with g.stopped set."""
        if not self._s.attached:
            raise GraceError("steps() before attach()")
        for check in self._checks:
            check()
        return self._s.steps(total)

    def begin_step(self):
        """For a loop of your own: True to run the next step, False when the
        session stopped (exit_on_stop=False)."""
        return self._s.begin_step()

    def end_step(self):
        self._s.end_step()

    @contextlib.contextmanager
    def collective(self):
        """Marks a collective of your own (torch.distributed): its failure is
        a lost peer to wait for (just-in-time save, exit 42), not a bug."""
        try:
            yield
        except CollectiveError:
            raise
        except Exception as e:
            raise CollectiveError("%s: %s" % (type(e).__name__, e)) from e

    @contextlib.contextmanager
    def abortable_sockets(self):
        """Around torch.distributed.init_process_group (after attach): the
        connections it opens are shut down when a peer is lost, so a
        collective blocked on a dead or frozen peer fails at once (and
        g.collective() turns that into a just-in-time save) instead of
        waiting for torch's timeout. torch 1.13's Gloo group has no abort of
        its own. The TCPStore's port ($MASTER_PORT) is left alone."""
        before = _socket_fds()
        yield
        skip = int(os.environ.get("MASTER_PORT", "-1") or -1)
        self._s.add_abort_sockets(sorted(_socket_fds() - before), skip)

    def all_reduce_(self, t):
        """In-place sum over the workers of a float32 CPU tensor or numpy
        array: Grace's ring on Gloo, aborted at once when a peer is lost
        (raises CollectiveError). Bit-identical on every worker."""
        ptr, n = _state.float32_memory(t)
        self._s.all_reduce(ptr, n)
        return t

    def should_commit(self):
        """After the step's collectives: False when a recovery in place
        abandoned the step (a peer was replaced; the gradients are not
        whole). Skip the rest of the step (`continue`): the same step runs
        again, with the state, RNGs and batch it first had. With
        recover_in_place=True a step that skips this check stops the worker
        with an error rather than risk a wrong update."""
        return self._s.should_commit()

    recoveries = property(lambda self: self._s.recoveries,
                          doc="Recoveries in place this process took part in.")

    def finish(self):
        """After the last step: final checkpoint, backups removed, leave.
        The end of the `with` block calls it."""
        self._s.finish()

    def notify(self, detail="notify() from Python"):
        """A preemption notice from code (your own maintenance-event watcher)."""
        self._s.notify(detail)

    def quick_exit(self, code):
        """Ends the process at once (after a write in flight), skipping teardown."""
        self._s.quick_exit(code)

    def close(self):
        global _current
        if _current is self:
            _current = None
        if self._hook is not None and sys.excepthook == self._uncaught:
            sys.excepthook = self._hook
        self._hook = None
        atexit.unregister(self.close)
        self._s.close()

    # ----------------------------------------------------------------- status

    def _cluster(self, what):
        if not self._s.attached and not self._s.closed:
            raise GraceError("%s is known after attach() (it comes from the cluster configuration)" % what)
        return getattr(self._s, what)

    rank = property(lambda self: self._cluster("rank"))
    world_size = property(lambda self: self._cluster("world_size"))
    is_chief = property(lambda self: self._cluster("is_chief"))
    completed_steps = property(lambda self: self._s.completed_steps)
    exit_code = property(lambda self: self._s.exit_code)
    stop_reason = property(lambda self: self._s.stop_reason)
    stopped = property(lambda self: self._s.stopped)
    attached = property(lambda self: self._s.attached)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc is None:
                if self._s.attached and not self._s.stopped and not self._s.finished:
                    self.finish()
                return False
            if isinstance(exc, Stopped) or not self._failing_step_is_ours():
                return False
            if not self.exit_on_stop:
                self._s.fail_step("%s: %s" % (exc_type.__name__, exc), is_collective_failure(exc))
                return False
            code = self._report_failure(exc_type, exc, tb, traceback.print_exception)
            self._s.arm_stop_deadline(code)
            cls = Preempted if code == self._restart_code else Stopped
            raise cls(code, self._s.stop_reason) from None
        finally:
            self.close()
