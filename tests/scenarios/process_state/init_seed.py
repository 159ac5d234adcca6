"""A seed global set in main() and read by worker_init_fn, which seeds the
dataset's own generator in each worker."""

import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from _loop import sample, train

SEED = 0


class Noisy(Dataset):
    rng = None

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return sample(torch.from_numpy(self.rng.normal(size=4)) + i)


def seed_worker(worker_id):
    get_worker_info().dataset.rng = np.random.default_rng(SEED + worker_id)


def main():
    global SEED
    SEED = int(sys.argv[1]) if len(sys.argv) > 1 else 1234
    torch.manual_seed(0)
    train(DataLoader(Noisy(), batch_size=4, shuffle=True, num_workers=2,
                     worker_init_fn=seed_worker))


if __name__ == "__main__":
    main()
