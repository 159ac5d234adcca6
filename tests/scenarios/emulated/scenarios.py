"""Loaders whose batches depend on the worker count, for tests/test_emulated_workers.py.

``python -c 'import scenarios; scenarios.main([MODE, ...])'`` runs every
scenario (or those named) with W=2 and W=3 workers and prints, per run,
``RESULT <scenario> <W> <sha256 of every batch> <sha256 of the parent's
random states after>``. MODE ``real`` iterates with torch's own workers
(the test forces fork from outside), ``inline`` with autosafe_torch's
emulated workers. Every scenario starts from the same
parent seeds.
"""

import hashlib
import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_collate


class AugMap(Dataset):
    """Random augmentation from torch, ``random`` and numpy's global state."""

    def __init__(self, n=22):
        self.data = torch.arange(n * 4, dtype=torch.float32).view(n, 4)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        x = self.data[i] + torch.rand(4)
        return x * random.random() + float(np.random.rand()), i


class PerObjectRng(Dataset):
    """RNGs and a counter held by the dataset: each worker's copy has its own."""

    def __init__(self, n=14):
        self.n = n
        self.legacy = np.random.RandomState(0)
        self.modern = np.random.default_rng(0)
        self.gen = torch.Generator().manual_seed(0)
        self.calls = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.calls += 1
        return torch.tensor([i, self.calls, self.legacy.rand(), self.modern.random(),
                             torch.rand(1, generator=self.gen).item()])


class WorkerAware(Dataset):
    """Samples that depend on get_worker_info() and the worker's torch seed."""

    def __len__(self):
        return 13

    def __getitem__(self, i):
        info = get_worker_info()
        return torch.tensor([i, info.id, info.num_workers, info.seed % 9973,
                             torch.initial_seed() % 9973, len(info.dataset),
                             torch.get_num_threads()]) + torch.rand(7)


class InitDependent(Dataset):
    offset = 0

    def __len__(self):
        return 15

    def __getitem__(self, i):
        return torch.tensor([i + self.offset, np.random.rand(), random.random()])


def seeding_init_fn(worker_id):
    """The usual recipe: numpy from torch's seed, state on the worker's dataset copy."""
    info = get_worker_info()
    np.random.seed(torch.initial_seed() % 2 ** 32)
    random.seed(info.seed + 7)
    info.dataset.offset = 100 * (worker_id + 1)


class ShardedIterable(IterableDataset):
    """Worker k yields its own shard; the shards are uneven, one ends first."""

    LENGTHS = (3, 8, 5)

    def __iter__(self):
        info = get_worker_info()
        shards = range(info.num_workers) if info is None else [info.id]
        for k in shards:
            for j in range(self.LENGTHS[k]):
                yield torch.tensor([100.0 * k + j]) + torch.rand(2)


class TorchRandPlusId(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return torch.rand(1) + 10 * get_worker_info().id


class UnevenBatchSampler:
    """Batches of 1, 2, 3, 1, 2, 3... indices drawn from its own generator."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(3)).tolist()
        sizes = [1, 2, 3]
        i = k = 0
        while i < self.n:
            yield order[i:i + sizes[k % 3]]
            i += sizes[k % 3]
            k += 1

    def __len__(self):
        return len(list(iter(self)))


class NoisyCollate:
    """A collate_fn with its own RandomState: each worker has its own copy."""

    def __init__(self):
        self.rng = np.random.RandomState(5)

    def __call__(self, samples):
        batch = default_collate(samples)
        return batch[0] + float(self.rng.rand()), batch[1]


def _loader(workers, dataset, **kwargs):
    return DataLoader(dataset, num_workers=workers, **kwargs)


# name -> (loader factory, epochs, break epoch 2 after this many batches, parent step draws)
SCENARIOS = {
    "map_aug": (lambda w: _loader(w, AugMap(), batch_size=4, shuffle=True), 2, None, False),
    "map_generator_drop_last": (lambda w: _loader(
        w, AugMap(), batch_size=3, shuffle=True, drop_last=True,
        generator=torch.Generator().manual_seed(7)), 1, None, False),
    "per_object_rng": (lambda w: _loader(w, PerObjectRng(), batch_size=2), 1, None, False),
    "worker_info": (lambda w: _loader(w, WorkerAware(), batch_size=2), 1, None, False),
    "worker_init_fn": (lambda w: _loader(w, InitDependent(), batch_size=3,
                                         worker_init_fn=seeding_init_fn), 1, None, False),
    "iterable_uneven": (lambda w: _loader(w, ShardedIterable(), batch_size=2), 1, None, False),
    "iterable_drop_last": (lambda w: _loader(w, ShardedIterable(), batch_size=2,
                                             drop_last=True), 1, None, False),
    "persistent_map": (lambda w: _loader(w, AugMap(), batch_size=2, shuffle=True,
                                         persistent_workers=True, prefetch_factor=3), 3, 2, False),
    "persistent_iterable": (lambda w: _loader(w, ShardedIterable(), batch_size=2,
                                              persistent_workers=True), 3, None, False),
    "batch_size_none": (lambda w: _loader(w, AugMap(), batch_size=None, shuffle=True), 1, None,
                        False),
    "batch_sampler_collate": (lambda w: _loader(w, AugMap(), batch_sampler=UnevenBatchSampler(22),
                                                collate_fn=NoisyCollate()), 1, None, False),
    "isolation": (lambda w: _loader(w, TorchRandPlusId(), batch_size=1, prefetch_factor=4), 1,
                  None, False),
    # The training step draws from the parent's generators between batches.
    "parent_draws": (lambda w: _loader(w, AugMap(), batch_size=4, shuffle=True), 1, None, True),
}


def _feed(h, obj):
    if isinstance(obj, torch.Tensor):
        h.update(("%s %s" % (obj.dtype, tuple(obj.shape))).encode())
        h.update(obj.contiguous().numpy().tobytes())
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for x in obj:
            _feed(h, x)
        h.update(b"]")
    else:
        h.update(repr(obj).encode())


def parent_states_digest():
    h = hashlib.sha256()
    h.update(torch.get_rng_state().numpy().tobytes())
    h.update(repr(random.getstate()).encode())
    h.update(repr(np.random.get_state()).encode())
    return h.hexdigest()


def install(loader):
    """Make ``loader`` iterate through emulated workers (no ladder involved)."""
    from autosafe_torch.remedies.emulated_workers import EmulatedWorkersIter

    loader._get_iterator = lambda: EmulatedWorkersIter(loader)


def run(name, workers, mode):
    factory, epochs, break_after, parent_draws = SCENARIOS[name]
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    loader = factory(workers)
    if mode != "real":
        install(loader)
    h = hashlib.sha256()
    for epoch in range(epochs):
        for n, batch in enumerate(loader):
            _feed(h, batch)
            if parent_draws:
                _feed(h, (torch.rand(1), random.random(), np.random.rand()))
            if epoch == 1 and break_after is not None and n + 1 == break_after:
                break
    print("RESULT", name, workers, h.hexdigest(), parent_states_digest(), flush=True)


def main(argv):
    mode, names = argv[0], argv[1:] or list(SCENARIOS)
    for name in names:
        for workers in (2, 3):
            run(name, workers, mode)
