"""A dataset that guards its cache with threading's locks, built in __init__.

python locked_cache.py [HOLD]

The cache is guarded by a Lock, its statistics by an RLock, and a Condition
and an Event sit beside them: none pickles, so spawn workers (macOS, Windows,
Linux from Python 3.14) cannot start; forked workers copy them unheld. HOLD=held:
a thread of the training process holds the lock while the loader iterates (no
worker may be given it). Each sample: its index, the worker id, per-worker
seeded draws (torch, random, numpy) and the copy's fetch count. Prints
``BATCHES <sha256>`` and ``PIDS`` (worker processes that fetched, not this one).
"""

import hashlib
import os
import random
import sys
import threading

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info


class LockedCache(Dataset):
    def __init__(self):
        self.lock = threading.Lock()
        self.stats_lock = threading.RLock()
        self.ready = threading.Condition()
        self.loaded = threading.Event()
        self.cache, self.fetches = {}, 0

    def __len__(self):
        return 24

    def __getitem__(self, i):
        with self.lock:
            if i not in self.cache:
                self.cache[i] = torch.full((2,), float(i))
        with self.stats_lock:
            self.fetches += 1
        info = get_worker_info()
        noise = torch.tensor([torch.rand(1).item(), random.random(), float(np.random.rand())])
        return torch.cat([self.cache[i], torch.tensor([float(info.id), float(self.fetches)]),
                          noise]), os.getpid()


def main():
    hold = sys.argv[1:2] == ["held"]
    torch.manual_seed(0)
    dataset = LockedCache()
    loader = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2)
    release = threading.Event()
    if hold:
        held = threading.Event()

        def holder():
            with dataset.lock:
                held.set()
                release.wait()

        threading.Thread(target=holder, daemon=True).start()
        held.wait()
    model = torch.nn.Linear(7, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    h, pids = hashlib.sha256(), set()
    try:
        for x, pid in loader:
            h.update(x.numpy().tobytes())
            pids.update(pid.tolist())
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
    finally:
        release.set()
    print("BATCHES", h.hexdigest(), flush=True)
    print("PIDS", len(pids - {os.getpid()}), flush=True)


if __name__ == "__main__":
    main()
