"""A lambda and a local function as collate_fn and worker_init_fn: fine under
fork, but spawned workers unpickle them by name:
"Can't pickle local object 'main.<locals>.<lambda>'". (A lambda that reads
no local variable: tests/scenarios/fix/unguarded.py.)
"""

import hashlib
import random

import torch
from torch.utils.data import DataLoader, Dataset


class Noisy(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.full((3,), float(i)) + torch.rand(3) + random.random()


def checksum(loader, h):
    for batch in loader:
        h.update(batch.numpy().tobytes())


def main(scale=3.0):
    torch.manual_seed(0)
    offset = 0.5

    def seed_worker(worker_id):
        random.seed(1000 + worker_id)  # the worker's python RNG, as the recipe says

    h = hashlib.sha256()
    loader = DataLoader(Noisy(), batch_size=4, num_workers=2,
                        collate_fn=lambda samples: torch.stack(samples) * scale + offset,
                        worker_init_fn=seed_worker)
    checksum(loader, h)
    print("BATCHES", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
