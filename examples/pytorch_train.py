#!/usr/bin/python3
"""A data-parallel PyTorch trainer that survives preemption and hard failures
with Grace, and resumes bit for bit.

    grace-launch --nproc 4 --checkpoint-dir ck -- /usr/bin/python3 examples/pytorch_train.py --steps 300

An nn.Module MLP (LayerNorm, GELU, dropout, an int64 buffer), AdamW,
grace.data.ResumableLoader over a deterministic synthetic dataset (exact
after a restart with prefetching workers too), gradients averaged with grace.all_reduce_ (Grace's
abortable Gloo ring) or, with --collective torch, torch.distributed's gloo
group (init_process_group from grace-launch's torchrun variables). Takes
grace-train's flags, so grace-chaos drives it:

    grace-chaos --seed 7 --out /tmp/chaos -- /usr/bin/python3 examples/pytorch_train.py

Run with Debian's /usr/bin/python3 (python3-torch); the grace module comes
from the build tree (PYTHONPATH=build/python) or `cmake --install`.
"""
import argparse
import datetime
import hashlib
import json
import os
import random
import sys
import time

# From a source checkout: the module built in build/ (else PYTHONPATH or `cmake --install`).
_BUILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "python")
if os.path.isdir(os.path.join(_BUILD, "grace")):
    sys.path.insert(0, _BUILD)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import grace  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=64, help="global batch (split over the workers)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--input-dim", type=int, default=64)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--samples", type=int, default=4096, help="dataset size (an epoch)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--loader-workers", type=int, default=0, help="DataLoader worker processes (prefetching)")
    p.add_argument("--checkpoint-dir", default=None, help="default $GRACE_CHECKPOINT_DIR")
    p.add_argument("--save-every", type=int, default=0, help="periodic checkpoint every N steps (0: off)")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep backups after a successful finish")
    p.add_argument("--grace-period-ms", type=int, default=0)
    p.add_argument("--notice-file", default=None)
    p.add_argument("--collective", choices=["grace", "torch"], default="grace",
                   help="gradient allreduce: grace.all_reduce_ (abortable) or torch.distributed (gloo)")
    p.add_argument("--torch-timeout-s", type=float, default=30, help="init_process_group timeout")
    p.add_argument("--torch-unabortable", action="store_true",
                   help="without g.abortable_sockets(): a collective blocked on a lost peer waits for "
                        "torch's timeout (or the launcher's kill)")
    p.add_argument("--output", default=None, help="JSON summary (steps, weights checksum) from rank 0")
    p.add_argument("--device", choices=["cpu"], default="cpu", help="torch CPU tensors (the flag grace-chaos passes)")
    p.add_argument("--step-delay-ms", type=int, default=0, help="sleep in every step (tests, demos)")
    p.add_argument("--fail-at-step", type=int, default=0, help="raise an error in this step (tests)")
    p.add_argument("--fail-rank", type=int, default=0)
    return p.parse_args()


class Net(nn.Module):
    def __init__(self, d_in, hidden, classes):
        super().__init__()
        self.inp = nn.Linear(d_in, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.mid = nn.Linear(hidden, hidden)
        self.drop = nn.Dropout(0.1)
        self.out = nn.Linear(hidden, classes)
        self.register_buffer("updates", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        h = F.gelu(self.norm(self.inp(x)))
        return self.out(self.drop(F.gelu(self.mid(h))))


class SyntheticData(torch.utils.data.Dataset):
    """Inputs from a seeded generator; labels from a fixed random teacher."""

    def __init__(self, n, d_in, classes, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, d_in, generator=g)
        teacher = torch.randn(d_in, classes, generator=g)
        self.y = (self.x @ teacher).argmax(dim=1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def flat_gradients(model):
    """One contiguous buffer with every parameter's .grad a view into it:
    one allreduce per step, and zero_grad keeps the views."""
    params = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in params))
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


def checksum(model, opt):
    """sha256 over every parameter, buffer and optimizer state tensor."""
    h = hashlib.sha256()
    tensors = list(model.state_dict().items())
    for i, st in sorted(opt.state_dict()["state"].items()):
        tensors += [("opt.%d.%s" % (i, k), v) for k, v in sorted(st.items()) if torch.is_tensor(v)]
    for name, t in tensors:
        h.update(name.encode())
        h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def main():
    a = parse_args()
    torch.set_num_threads(1)  # deterministic, and leaves cores to the other workers
    # recover_in_place: under grace-launch --recovery in-place a lost peer is
    # replaced while this process trains on (Grace's all_reduce_ only).
    with grace.Session(a.checkpoint_dir, save_every=a.save_every, grace_period_ms=a.grace_period_ms,
                       keep_checkpoints_on_success=a.keep_checkpoints, notice_file=a.notice_file,
                       recover_in_place=a.collective == "grace") as g:
        # The same seeds on every rank: dropout draws (and any numpy or
        # Python random draws) stay identical, so the saver's RNG states are
        # every rank's (grace saves one copy, like the parameters).
        torch.manual_seed(a.seed)
        np.random.seed(a.seed)
        random.seed(a.seed)
        model = Net(a.input_dim, a.hidden, a.classes)
        flat = flat_gradients(model)
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
        data = SyntheticData(a.samples, a.input_dim, a.classes, a.seed)
        # Resumable and exact with prefetching workers: its position is the
        # batches the loop took, not what the workers drew ahead.
        loader = grace.data.ResumableLoader(data, a.batch, seed=a.seed, num_workers=a.loader_workers,
                                            generator=torch.Generator().manual_seed(a.seed))
        g.register_module(model)
        g.register_optimizer(opt)
        g.register_rng()
        g.register_stateful("loader", loader)
        steps_done, index_sum = g.counter("steps_done"), g.counter("step_index_sum")
        start = g.attach()  # from here on: rank, world size; the state of the newest checkpoint
        rank, world = g.rank, g.world_size
        if a.batch % world:
            print("--batch %d must be a multiple of the %d workers" % (a.batch, world), file=sys.stderr)
            g.quick_exit(grace.USAGE)
        loader.place(rank, world)
        if a.collective == "torch" and world > 1:
            import torch.distributed as dist
            timeout = datetime.timedelta(seconds=a.torch_timeout_s)
            if a.torch_unabortable:
                dist.init_process_group("gloo", timeout=timeout)
            else:
                with g.abortable_sockets():  # a lost peer shuts the group's connections down
                    dist.init_process_group("gloo", timeout=timeout)
        batches = loader.batches()
        t0, loss = time.time(), torch.zeros(())
        for step in g.steps(a.steps):
            if step == a.fail_at_step and rank == a.fail_rank:
                raise RuntimeError("injected failure at step %d" % step)
            x, y = next(batches)
            opt.zero_grad(set_to_none=False)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            if world > 1:
                if a.collective == "torch":
                    with g.collective():
                        dist.all_reduce(flat)
                else:
                    grace.all_reduce_(flat)
                if not g.should_commit():  # a peer was replaced in place: this step runs again
                    continue
                flat.div_(world)
            opt.step()
            model.updates += 1
            steps_done.value += 1
            index_sum.value += step
            if a.step_delay_ms:
                time.sleep(a.step_delay_ms / 1000)
            if rank == 0 and (step % 50 == 0 or step == a.steps):
                rate = (step - start) / max(time.time() - t0, 1e-9)
                print("step %d/%d  loss %.4f  %.1f steps/s" % (step, a.steps, loss.item(), rate), flush=True)
    # Finished: the final checkpoint is on disk.
    if rank == 0 and a.output:
        with open(a.output, "w") as f:
            json.dump({"steps": a.steps, "steps_done": steps_done.value, "step_index_sum": index_sum.value,
                       "weights_checksum": checksum(model, opt), "world_size": world, "loss": loss.item()}, f,
                      indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
