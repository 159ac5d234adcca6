"""Samples that are dicts (nested) and namedtuples; the batch keeps their type."""

from collections import namedtuple

import torch
from torch.utils.data import DataLoader, Dataset

from _common import digest, finish, num_workers, record_warnings, seed_all, state

Sample = namedtuple("Sample", ["image", "label", "name"])


class DictSamples(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, idx):
        return {"image": torch.rand(2, 2), "meta": {"index": idx, "name": "s%d" % idx}}


class TupleSamples(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, idx):
        return Sample(torch.rand(3), idx % 3, "n%d" % idx)


def main():
    record_warnings()
    seed_all(7)
    workers = num_workers()
    dicts = DataLoader(DictSamples(), batch_size=4, num_workers=workers)
    tuples = DataLoader(TupleSamples(), batch_size=4, shuffle=True, num_workers=workers)
    state("num_workers", "%d %d" % (dicts.num_workers, tuples.num_workers))
    digest(dicts)
    batch = next(iter(tuples))
    state("namedtuple_batch", "%s %s" % (type(batch).__name__, list(batch._fields)))
    digest(tuples)
    finish()


if __name__ == "__main__":
    main()
