"""grace.Session: the embedding API (actors/session.hpp) with Python idioms.

Signals: a Session blocks SIGTERM and SIGINT in the thread that creates it
(create it in the main thread, before starting threads of your own), and
attach() starts Grace's signal watcher, which takes both. From then until
close(), Ctrl-C and SIGTERM are preemption notices: the workers agree on a
step, save it and exit with the restart code. Python's KeyboardInterrupt
does not happen meanwhile, and a handler installed with signal.signal()
would take the signals away from Grace: install none while a session is
open. close() (the end of the `with` block) puts Python's handlers back.
"""
import contextlib
import os
import sys
import traceback

from . import _grace
from . import state as _state
from ._grace import CollectiveError, GraceError

_current = None


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
    (a notice, a lost peer, an error elsewhere), end the process with its exit
    code (42: restart me); False leaves the loop instead, and the caller exits
    with g.exit_code. collective_timeout_ms bounds the rendezvous and every
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
                 replicas=True, connect_timeout_ms=30000):
        checkpoint_dir = checkpoint_dir or os.environ.get("GRACE_CHECKPOINT_DIR") or "grace-checkpoints"
        if restart_exit_code is None:
            restart_exit_code = int(os.environ.get("GRACE_RESTART_CODE", _grace.RESTART))
        self.exit_on_stop = exit_on_stop
        self._s = _grace.Session(
            exit_on_stop=exit_on_stop, collective_timeout_ms=collective_timeout_ms,
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
        self._checks = []       # callables raising GraceError when registered memory moved
        self._after_attach = []  # callables(restored_step)
        self._blobs = []        # (name, save) for the size check at attach

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
        JSON (a data sampler's position): saved as a blob."""
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
        return start

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
            if self._s.attached and not self._s.stopped:
                collective = isinstance(exc, CollectiveError)
                code = self._s.fail_step("%s: %s" % (exc_type.__name__, exc), collective)
                if self.exit_on_stop:
                    if collective:
                        print("grace: %s; %s" % (exc, self._s.stop_reason), file=sys.stderr)
                    else:
                        traceback.print_exception(exc_type, exc, tb)
                    self._s.quick_exit(code)
            return False
        finally:
            self.close()
