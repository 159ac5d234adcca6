"""Persistent workers over several epochs, with random augmentation.

Each worker's RNG runs on from one epoch to the next: recreating the
workers, or another worker count, gives other batches from epoch 2 on.
"""

import torch
from torch.utils.data import DataLoader, Dataset

from _common import digest, finish, num_workers, record_warnings, seed_all, state


class Jittered(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, idx):
        return torch.full((2,), float(idx)) + torch.rand(2)


def main():
    record_warnings()
    seed_all(4)
    loader = DataLoader(Jittered(), batch_size=4, shuffle=True, num_workers=num_workers(),
                        persistent_workers=True)
    state("num_workers", loader.num_workers)
    digest(loader, epochs=3)
    finish()


if __name__ == "__main__":
    main()
