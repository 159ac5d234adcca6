"""A GPU training script's loader: fork workers after CUDA is initialised.

python cuda_workers.py TOUCH [HOLD]

- TOUCH: ``never`` (the ordinary GPU script: the workers never touch CUDA,
  and forked workers are what PyTorch supports), or ``after:N``: after its
  first N fetches, each dataset copy's ``__getitem__`` touches CUDA
  (``.cuda()`` on a GPU; under the simulation, ``torch.cuda.init()``, the
  first thing any CUDA call does): after:8, each of 2 workers fails on its
  third batch of 4, past batches already delivered;
- HOLD: ``stream``: the dataset holds a generator, so it does not pickle and
  spawn cannot take it (the dataset is built again in each spawn worker, as
  construction left it); ``spent``: the same, advanced once after
  construction, so no build gives it (emulated workers).

CUDA is initialised in this process before the first batch: on a GPU by
``model.cuda()``, built after the loader as real scripts do; without one by
tests/platform_sim (``AUTOSAFE_TEST_CUDA=initialised``). Every batch takes a
real training step. Each sample: its index, the worker id and seed, draws
from torch's, Python's and numpy's global generators (seeded per worker), the
dataset copy's fetch count, and, for TOUCH=never, whether the worker
inherited this process's state (1: forked; 0: a new process). Prints
``BATCHES <sha256>`` over every batch, in order, its device included, and
``PIDS`` the number of worker processes that fetched.
"""

import hashlib
import os
import random
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

INHERITED = []  # filled in the training process before the workers start


class Samples(Dataset):
    def __init__(self, touch_after, hold):
        self.touch_after = touch_after
        self.stream = (i for i in range(3)) if hold in ("stream", "spent") else None
        self.fetches = 0

    def __len__(self):
        return 24

    def __getitem__(self, i):
        self.fetches += 1
        if self.touch_after is not None and self.fetches > self.touch_after:
            touch_cuda()
        info = get_worker_info()
        values = [float(i), float(info.id), float(info.seed % 10007), torch.rand(1).item(),
                  random.random(), float(np.random.rand()), float(self.fetches)]
        return torch.tensor(values + self.more()), os.getpid()

    def more(self):
        return []


class Inheriting(Samples):
    """TOUCH=never: each sample says whether its worker inherited this process's
    state (a spawned worker would read the module's import-time value: the shim,
    which leaves this loader alone, would refuse to send it to spawn workers)."""

    def more(self):
        return [float(len(INHERITED))]


def touch_cuda():
    if torch.cuda.is_available():
        torch.zeros(1).cuda()
    else:
        torch.cuda.init()


def main():
    touch = sys.argv[1]
    hold = sys.argv[2] if len(sys.argv) > 2 else None
    touch_after = None if touch == "never" else int(touch.split(":")[1])
    torch.manual_seed(0)
    INHERITED.append(1)
    dataset = (Inheriting if touch_after is None else Samples)(touch_after, hold)
    if hold == "spent":
        next(dataset.stream)
    loader = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Linear(8 if touch_after is None else 7, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    h, pids = hashlib.sha256(), set()
    for x, pid in loader:
        h.update(("%s %s" % (x.device, tuple(x.shape))).encode())
        h.update(x.cpu().numpy().tobytes())
        pids.update(pid.tolist())
        loss = model(x.to(device)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("BATCHES", h.hexdigest(), flush=True)
    print("PIDS", len(pids - {os.getpid()}), flush=True)


if __name__ == "__main__":
    main()
