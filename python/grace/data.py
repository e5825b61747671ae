"""A resumable, distributed data loader that stays exact with prefetching
workers.

A DataLoader with num_workers > 0 draws indices from its sampler ahead of
the training loop (prefetch_factor batches per worker), so a sampler that
counts what it has yielded is ahead of what the trainer has seen: saving
that position skips samples after a restart. ResumableLoader counts the
batches it has handed to the trainer instead, and a restore starts the
next iteration at the first batch the trainer did not take.

    loader = grace.data.ResumableLoader(dataset, global_batch=64, seed=1, num_workers=2)
    g.register_stateful("loader", loader)     # (epoch, batch) as of every step boundary
    g.attach()
    loader.place(g.rank, g.world_size)        # this rank's slice of every global batch
    batches = loader.batches()                # endless, epoch after epoch
    for step in g.steps(total):
        x, y = next(batches)                  # take the step's batch inside the step

Every epoch is a permutation of the dataset drawn from (seed, epoch) (or
the identity with shuffle=False); global batch b of an epoch is its items
b*G .. (b+1)*G-1 and rank r takes the r-th 1/world of them, so the order
does not depend on the number of workers, and a restore on another world
size (the same global batch) continues with the same samples. A partial
last global batch is dropped, as DataLoader's drop_last does. Grace saves
the state with the chief's other blobs; it is the same on every rank.
"""
import torch

from ._grace import GraceError


class _EpochSampler(torch.utils.data.Sampler):
    """This rank's indices of one epoch from a given global batch on."""

    def __init__(self, owner):
        self.owner = owner

    def __iter__(self):
        o = self.owner
        order = o.order(o.epoch)
        local = o.global_batch // o.world
        for b in range(o.batch, o.batches_per_epoch()):
            start = b * o.global_batch + o.rank * local
            yield from order[start:start + local].tolist()

    def __len__(self):
        o = self.owner
        return (o.batches_per_epoch() - o.batch) * (o.global_batch // o.world)


class ResumableLoader:
    """dataset: a map-style dataset; global_batch: samples per step over all
    ranks (a multiple of the world size); the other keyword arguments go to
    torch.utils.data.DataLoader (num_workers, pin_memory, collate_fn, ...;
    not batch_size, sampler, shuffle or drop_last, which this class sets)."""

    def __init__(self, dataset, global_batch, *, seed=0, shuffle=True, **loader_kwargs):
        for k in ("batch_size", "sampler", "batch_sampler", "shuffle", "drop_last"):
            if k in loader_kwargs:
                raise TypeError("ResumableLoader sets DataLoader's %s itself" % k)
        if int(global_batch) <= 0:
            raise ValueError("global_batch must be positive, not %r" % (global_batch,))
        self.dataset, self.global_batch, self.seed, self.shuffle = dataset, int(global_batch), int(seed), shuffle
        if len(dataset) < self.global_batch:
            raise ValueError("the dataset has %d samples, fewer than one global batch of %d"
                             % (len(dataset), self.global_batch))
        self.loader_kwargs = loader_kwargs
        self.epoch, self.batch = 0, 0   # the next global batch the trainer takes
        self._generation = 0            # load_state_dict calls: ends an iteration begun before one
        self.rank, self.world = 0, 1

    def place(self, rank, world_size):
        """This rank's place (after attach): which slice of each batch it loads."""
        if self.global_batch % world_size:
            raise GraceError("global_batch %d is not a multiple of the %d ranks" % (self.global_batch, world_size))
        self.rank, self.world = int(rank), int(world_size)

    def order(self, epoch):
        n = len(self.dataset)
        if not self.shuffle:
            return torch.arange(n)
        return torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 1000003 + epoch))

    def batches_per_epoch(self):
        return len(self.dataset) // self.global_batch

    def __len__(self):
        """Batches left in the current epoch."""
        return self.batches_per_epoch() - self.batch

    def __iter__(self):
        """The rest of the current epoch, batch by batch; the position moves
        as each batch is handed out (not as workers prefetch)."""
        loader = torch.utils.data.DataLoader(self.dataset, batch_size=self.global_batch // self.world,
                                             sampler=_EpochSampler(self), drop_last=True, **self.loader_kwargs)
        generation = self._generation
        for item in loader:
            if self._generation != generation:
                return  # load_state_dict moved the position (a recovery in place): iterate again from there
            self.batch += 1
            yield item
        if self._generation == generation:  # else the restored position stands
            self.epoch, self.batch = self.epoch + 1, 0

    def batches(self):
        """Every batch, epoch after epoch, without end; after a
        load_state_dict it goes on from the restored position."""
        while True:
            yield from self

    def state_dict(self):
        return {"epoch": self.epoch, "batch": self.batch, "global_batch": self.global_batch, "seed": self.seed}

    def load_state_dict(self, state):
        if state.get("global_batch", self.global_batch) != self.global_batch or \
                state.get("seed", self.seed) != self.seed:
            raise GraceError("the checkpoint's loader had global_batch %s and seed %s, this one %d and %d: "
                             "resuming would read other samples" % (state.get("global_batch"), state.get("seed"),
                                                                     self.global_batch, self.seed))
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])
        self._generation += 1
