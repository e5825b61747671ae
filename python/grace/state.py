"""What a Session registers from torch and numpy: tensors by memory, an
optimizer's state, RNG states and objects with a state_dict() as blobs.

torch is imported lazily: a numpy-only trainer never loads it.

Lazily created optimizer state. torch.optim creates an optimizer's state at
its first step(), but a restore needs the memory before the first step. So
register_optimizer creates the state at once by running one step with zero
gradients and putting the parameters and gradients back; those tensors are
what Grace registers. A counter "<prefix>live" records whether the state in a
checkpoint is real:
- restored with live=1: the registered tensors hold the saved state and are
  the optimizer's state; training continues as if never interrupted;
- a fresh start (or a checkpoint taken before the first step, live=0): the
  optimizer's state is cleared, so torch's own first step initialises it
  exactly as in an uninterrupted run; right after that step Grace copies it
  into the registered tensors and puts those back into the optimizer (the
  adoption), and live becomes 1.
Every parameter that requires a gradient must have one at the first step
(torch creates no state for one without): adoption raises GraceError
otherwise. Frozen parameters (requires_grad=False) get no state.
"""
import base64
import functools
import json
import pickle
import random

import numpy as np

from ._grace import GraceError

_TORCH_DTYPES = None


def _torch_dtypes():
    global _TORCH_DTYPES
    if _TORCH_DTYPES is None:
        import torch
        _TORCH_DTYPES = {
            torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
            torch.int8: "I8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64",
            torch.uint8: "U8", torch.bool: "BOOL",
        }
    return _TORCH_DTYPES


def is_torch_tensor(t):
    mod = type(t).__module__
    if not (mod.startswith("torch") or type(t).__name__ == "Parameter"):
        return False
    import torch
    return isinstance(t, torch.Tensor)


def tensor_memory(name, t):
    """(safetensors dtype, shape, data pointer, owner) of a registrable
    tensor; the owner (a detached alias) keeps the storage alive."""
    import torch
    if t.layout != torch.strided:
        raise ValueError("'%s' is a %s tensor: Grace registers dense tensors" % (name, t.layout))
    if t.device.type != "cpu":
        raise ValueError("'%s' is on %s: the Python module registers CPU tensors (move the model to the CPU "
                         "before registering it)" % (name, t.device))
    dtype = _torch_dtypes().get(t.dtype)
    if dtype is None:
        raise TypeError("'%s' has dtype %s, which safetensors cannot hold (bool, int8-64, uint8, float16, "
                        "bfloat16, float32, float64)" % (name, t.dtype))
    if not t.is_contiguous():
        raise ValueError("'%s' is not contiguous (shape %s, stride %s): Grace saves and restores a tensor's "
                         "memory as one block; make the tensor the model trains contiguous before "
                         "registering it" % (name, tuple(t.shape), t.stride()))
    if t.is_neg() or t.is_conj():
        raise ValueError("'%s' is a lazily negated or conjugated view: register the tensor it views" % name)
    return dtype, list(t.shape), t.data_ptr(), t.detach()


def pointer_check(name, t, ptr):
    """A check that `t` still lives at `ptr` (a `.data =` or `.to()` after
    registering would leave Grace saving memory the trainer no longer uses)."""
    def check():
        if t.data_ptr() != ptr:
            raise GraceError("'%s' moved since it was registered (assigned .data, .to(), or the optimizer's "
                             "load_state_dict?): register state after its last move" % name)
    return check


def float32_memory(t):
    """(pointer, element count) of a contiguous float32 CPU tensor or array."""
    if is_torch_tensor(t):
        import torch
        if t.device.type != "cpu" or t.dtype != torch.float32 or not t.is_contiguous() or t.layout != torch.strided:
            raise ValueError("all_reduce_ takes a contiguous float32 CPU tensor, not %s %s on %s%s"
                             % (t.dtype, tuple(t.shape), t.device, "" if t.is_contiguous() else " (not contiguous)"))
        return t.data_ptr(), t.numel()
    a = np.asarray(t)
    if a is not t or a.dtype != np.float32 or not a.flags.c_contiguous or not a.flags.writeable:
        raise ValueError("all_reduce_ takes a contiguous, writable float32 array or CPU tensor")
    return a.ctypes.data, a.size


# ------------------------------------------------------------------ optimizer

def _param_index(optimizer):
    """id(param) -> its index in optimizer.state_dict()['state']."""
    index, start = {}, 0
    for group in optimizer.param_groups:
        for i, p in enumerate(group["params"], start):
            index.setdefault(id(p), i)
        start += len(group["params"])
    return index


def _materialise(optimizer):
    """Runs one step with zero gradients so torch creates the state; puts
    the parameters and gradients back. The class's step, not the instance
    attribute an LR scheduler wraps (its step counter stays untouched)."""
    import torch
    params = [p for g in optimizer.param_groups for p in g["params"]]
    saved = [(p, p.detach().clone(), p.grad) for p in params]
    try:
        with torch.no_grad():
            for p in params:  # a frozen parameter never gets state: nor here
                p.grad = torch.zeros_like(p) if p.requires_grad else None
        type(optimizer).step(optimizer)
    except Exception as e:
        raise GraceError("cannot create the state of %s before its first step (%s: %s): register it "
                         "after one real step instead" % (type(optimizer).__name__, type(e).__name__, e)) from e
    finally:
        with torch.no_grad():
            for p, data, grad in saved:
                p.copy_(data)
                p.grad = grad


def _json_value(v, where):
    try:
        json.dumps(v)
    except (TypeError, ValueError):
        raise TypeError("%s is a %s: Grace saves optimizer tensors and JSON values (numbers, bools, "
                        "None, lists)" % (where, type(v).__name__)) from None
    return v


def _like(old, new):
    """`new` from JSON, with the container type of `old` (betas are tuples)."""
    return tuple(new) if isinstance(old, tuple) and isinstance(new, list) else new


def register_optimizer(session, optimizer, prefix):
    import torch
    fresh = not any(len(s) for s in optimizer.state.values())
    if fresh:
        _materialise(optimizer)
    index = _param_index(optimizer)
    params = {i: p for g in optimizer.param_groups for p in g["params"] for i in [index[id(p)]]}
    registered = []  # (param, key, tensor)
    names = []
    for p, st in optimizer.state.items():
        for key, v in st.items():
            name = "%sstate.%d.%s" % (prefix, index[id(p)], key)
            if torch.is_tensor(v):
                session.register_tensor(name, v)
                registered.append((p, key, v))
                names.append(name)
            else:
                _json_value(v, "optimizer state '%s'" % name)
    live = session.counter(prefix + "live", 0 if fresh else 1)

    def snapshot():  # every step boundary: shallow copies (the values are numbers and tuples)
        scalars = {"%d.%s" % (index[id(p)], k): v for p, st in optimizer.state.items()
                   for k, v in st.items() if not torch.is_tensor(v)}
        groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        return groups, scalars

    def save(snap):  # at a checkpoint
        for p, key, t in registered:
            if live.value and optimizer.state.get(p, {}).get(key) is not t:
                raise GraceError("optimizer state '%sstate.%d.%s' was replaced since it was registered "
                                 "(optimizer.load_state_dict after register_optimizer?)" % (prefix, index[id(p)], key))
        groups, scalars = snap
        groups = [dict(g, params=[index[id(p)] for p in pg["params"]])
                  for g, pg in zip(groups, optimizer.param_groups)]
        return json.dumps({"param_groups": groups, "scalars": scalars}).encode()

    def restore(blob):
        d = json.loads(blob)
        if len(d["param_groups"]) != len(optimizer.param_groups):
            raise GraceError("the checkpoint's optimizer has %d parameter groups, this one %d"
                             % (len(d["param_groups"]), len(optimizer.param_groups)))
        for group, saved in zip(optimizer.param_groups, d["param_groups"]):
            for k, v in saved.items():
                if k != "params":
                    group[k] = _like(group.get(k), v)
        for where, v in d["scalars"].items():
            i, key = where.split(".", 1)
            optimizer.state[params[int(i)]][key] = v

    session.register_blob(prefix + "param_groups", save, restore, snapshot=snapshot)
    session._after_attach.append(lambda start: _after_attach(optimizer, registered, live))
    return names


def _after_attach(optimizer, registered, live):
    if live.value:
        return  # restored: the registered tensors are the optimizer's state
    optimizer.state.clear()
    step = optimizer.step  # possibly an LR scheduler's wrapper: keep it
    adopted = [False]

    @functools.wraps(step)  # keeps the scheduler wrapper's marks (_with_counter)
    def first_step(*args, **kwargs):
        result = step(*args, **kwargs)
        if not adopted[0]:
            _adopt(optimizer, registered)
            adopted[0] = True
            live.value = 1
        return result

    optimizer.step = first_step


def _adopt(optimizer, registered):
    """Copies the state torch's first step created into the registered
    tensors and makes those the optimizer's state again."""
    import torch
    known = {(id(p), key) for p, key, _ in registered}
    for p, st in optimizer.state.items():
        for key, v in st.items():
            if torch.is_tensor(v) and (id(p), key) not in known:
                raise GraceError("optimizer state '%s' appeared after registration: Grace cannot save it" % key)
    with torch.no_grad():
        for p, key, t in registered:
            new = optimizer.state.get(p, {}).get(key)
            if new is None:
                raise GraceError("a parameter of shape %s got no gradient in the first step, so torch created "
                                 "no '%s' for it: Grace registers optimizer state before the first step and "
                                 "needs every parameter to have one" % (tuple(p.shape), key))
            if new.shape != t.shape or new.dtype != t.dtype:
                raise GraceError("optimizer state '%s' is %s %s after the first step, %s %s at registration"
                                 % (key, new.dtype, tuple(new.shape), t.dtype, tuple(t.shape)))
            t.copy_(new)
            optimizer.state[p][key] = t


# ---------------------------------------------------------------------- blobs

def register_rng(session, prefix, use_torch, use_numpy, use_python):
    """Snapshots are the RNG modules' own state objects (a few us each);
    they are encoded only at a checkpoint."""
    if use_torch:
        import torch
        session.register_blob(
            prefix + "torch", lambda t: t.numpy().tobytes(),
            lambda b: torch.set_rng_state(torch.frombuffer(bytearray(b), dtype=torch.uint8)),
            snapshot=torch.get_rng_state)

    if use_numpy:
        def np_save(state):
            kind, keys, pos, has_gauss, cached = state
            return json.dumps([kind, base64.b64encode(keys.astype("<u4").tobytes()).decode(), int(pos),
                               int(has_gauss), float(cached)]).encode()

        def np_restore(b):
            kind, keys, pos, has_gauss, cached = json.loads(b)
            np.random.set_state((kind, np.frombuffer(base64.b64decode(keys), dtype="<u4").astype(np.uint32),
                                 pos, has_gauss, cached))
        session.register_blob(prefix + "numpy", np_save, np_restore, snapshot=np.random.get_state)

    if use_python:
        def py_save(state):
            version, internal, gauss = state
            return json.dumps([version, list(internal), gauss]).encode()

        def py_restore(b):
            version, internal, gauss = json.loads(b)
            random.setstate((version, tuple(internal), gauss))
        session.register_blob(prefix + "python", py_save, py_restore, snapshot=random.getstate)


def encode_state(state):
    """JSON when the state comes back from JSON unchanged (readable in the
    manifest, nothing to unpickle); else a pickle (protocol 4, which starts
    with 0x80: no JSON text does, so decode_state tells them apart). Int
    keys and tuples, which JSON would turn into strings and lists, take
    the pickle."""
    try:
        text = json.dumps(state)
        if json.loads(text) == state:
            return text.encode()
    except (TypeError, ValueError):
        pass
    return pickle.dumps(state, protocol=4)


def decode_state(blob):
    """A checkpoint's pickled state runs code on load, as torch.load does:
    restore only checkpoints your job wrote (docs/SECURITY.md)."""
    return pickle.loads(blob) if blob[:1] == b"\x80" else json.loads(blob)


def register_stateful(session, name, obj):
    """obj.state_dict(), encoded at every step boundary (a state_dict may
    return the object's live containers, so no lazy copy): JSON, or a
    pickle when it is not JSON."""
    def save():
        return encode_state(obj.state_dict())
    try:
        save()
    except Exception as e:
        raise TypeError("'%s': state_dict() must return JSON or picklable values: %s: %s"
                        % (name, type(e).__name__, e)) from None
    session.register_blob(name, save, lambda b: obj.load_state_dict(decode_state(b)))
