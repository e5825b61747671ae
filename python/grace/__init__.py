"""Grace for Python trainers: survive preemption and hard failures without
losing work, and resume bit for bit.

    import grace

    with grace.Session(save_every=100) as g:   # first thing: blocks SIGTERM/SIGINT for later threads
        g.register_module(model)               # parameters and buffers, by their memory (no copies)
        g.register_optimizer(opt)              # its state, named as in opt.state_dict()
        g.register_rng()                       # torch, numpy and Python RNG states
        g.register_stateful("sampler", sampler)
        g.attach()                             # join the cluster, restore the newest valid checkpoint
        for step in g.steps(total):            # a notice: save, raise grace.Preempted (exit 42);
            train_step(step)                   #   grace-launch restarts us (finally/atexit still run)
    # here: finished, the final checkpoint is on disk

    state = grace.load("grace-checkpoints", prefix="model.")   # no runtime needed
    model.load_state_dict(state)

Run it under `grace-launch --nproc N -- /usr/bin/python3 train.py` (Debian's
interpreter, where python3-torch lives). See README.md, "Python / PyTorch".
"""
import os as _os

from . import _grace


def _take_standby_release():
    """A warm spare of `grace-launch --standby` waits here, at its first
    `import grace`, until the launcher makes it a worker; os.environ then
    holds that worker's environment (incarnation, MASTER_PORT, ...)."""
    released = _grace._await_standby()
    if released is not None:
        _os.environ.update(released)
        _os.environ.pop("GRACE_STANDBY_FD", None)


_take_standby_release()

from ._grace import CollectiveError, Counter, GraceError, MAX_BLOB_BYTES, RESTART, FATAL, USAGE, set_log_level
from .checkpoint import checkpoint_path, load, load_numpy, optimizer_state_dict, read_manifest
from .session import Preempted, Session, Stopped, all_reduce_, current, is_collective_failure

__all__ = [
    "Session", "Stopped", "Preempted", "is_collective_failure", "GraceError", "CollectiveError", "Counter", "all_reduce_", "current",
    "load", "load_numpy", "optimizer_state_dict", "read_manifest", "checkpoint_path",
    "MAX_BLOB_BYTES", "RESTART", "FATAL", "USAGE", "set_log_level",
]


def __getattr__(name):
    """grace.data (it imports torch) loads on first use."""
    if name == "data":
        import importlib
        return importlib.import_module(".data", __name__)
    raise AttributeError("module 'grace' has no attribute %r" % name)
