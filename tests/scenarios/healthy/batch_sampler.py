"""A custom batch sampler: batches of varying size, drawn from its own generator."""

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from _common import digest, finish, num_workers, record_warnings, seed_all, state


class Uneven(Sampler):
    def __init__(self, n, seed):
        self.n = n
        self.generator = torch.Generator().manual_seed(seed)

    def __iter__(self):
        order = torch.randperm(self.n, generator=self.generator).tolist()
        sizes = [1, 2, 3, 4]
        start = 0
        k = 0
        while start < self.n:
            size = sizes[k % len(sizes)]
            yield order[start:start + size]
            start += size
            k += 1

    def __len__(self):
        return 8  # 1+2+3+4+1+2+3+4 = 20


class Augmented(Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, idx):
        return idx, torch.randn(3)


def main():
    record_warnings()
    seed_all(6)
    loader = DataLoader(Augmented(), batch_sampler=Uneven(20, 11), num_workers=num_workers())
    state("num_workers", loader.num_workers)
    digest(loader, epochs=2)
    finish()


if __name__ == "__main__":
    main()
