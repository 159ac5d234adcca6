"""Samples that carry the id of the worker that fetched them, and torch augmentation.

Run with a worker count above the CPUs usable (the test passes 3 with one
CPU): torch then warns "This DataLoader will create 3 worker processes in
total..." and every batch still depends on the 3 workers asked for.
"""

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from _common import digest, finish, num_workers, record_warnings, seed_all, state


class TaggedByWorker(Dataset):
    def __len__(self):
        return 18

    def __getitem__(self, idx):
        info = get_worker_info()
        return idx, (info.id if info is not None else -1), torch.rand(2)


def main():
    record_warnings()
    seed_all(2)
    loader = DataLoader(TaggedByWorker(), batch_size=3, shuffle=True, num_workers=num_workers())
    state("num_workers", loader.num_workers)
    digest(loader, epochs=2)
    finish()


if __name__ == "__main__":
    main()
