"""A dataset that counts and logs its fetches.

The count lives in a dict (shared by any shallow copy of the dataset) and
each fetch appends a line to fetches.log in the working directory: the
workers fetch each sample exactly once, and the parent never fetches.
"""

import os

import torch
from torch.utils.data import DataLoader, Dataset

from _common import digest, finish, num_workers, record_warnings, seed_all, state

LOG = "fetches.log"


class Counting(Dataset):
    def __init__(self):
        self.stats = {"fetches": 0}

    def __len__(self):
        return 12

    def __getitem__(self, idx):
        self.stats["fetches"] += 1
        with open(LOG, "a") as log:
            log.write("%d\n" % idx)
        return idx, torch.rand(2)


def main():
    record_warnings()
    seed_all(9)
    if os.path.exists(LOG):
        os.remove(LOG)
    dataset = Counting()
    loader = DataLoader(dataset, batch_size=3, num_workers=num_workers())
    state("num_workers", loader.num_workers)
    digest(loader)
    state("parent_fetches", dataset.stats["fetches"])
    with open(LOG) as log:
        logged = sorted(int(line) for line in log)
    state("logged_fetches", len(logged))
    state("logged_indices", logged)
    finish()


if __name__ == "__main__":
    main()
