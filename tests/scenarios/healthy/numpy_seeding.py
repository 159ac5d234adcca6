"""Per-worker seeding of numpy and random in worker_init_fn (PyTorch's recipe).

The augmentation draws from numpy's and Python's global generators, seeded
per worker from torch's per-worker seed: batches depend on each worker's id.
"""

import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from _common import digest, finish, num_workers, record_warnings, seed_all, state


def seed_worker(worker_id):
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


class NumpyAugmented(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, idx):
        noise = np.random.rand(3).astype(np.float32)
        return torch.from_numpy(noise) + idx, random.random()


def main():
    record_warnings()
    seed_all(1)
    loader = DataLoader(NumpyAugmented(), batch_size=4, shuffle=True,
                        num_workers=num_workers(), worker_init_fn=seed_worker)
    state("num_workers", loader.num_workers)
    digest(loader, epochs=2)
    finish()


if __name__ == "__main__":
    main()
