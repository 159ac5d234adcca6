"""A dataset that holds an open file and pickles correctly: __getstate__ drops the
handle, __setstate__ reopens it by path. It reads with os.pread (no shared
file offset), so it is also correct under fork, where nothing is pickled.

Checked against the known-safe run: num_workers=0 in the same script.
"""

import os

import torch
from torch.utils.data import DataLoader, Dataset

from _common import (RECORD, digest_of, finish, key_value_pairs, num_workers,
                     record_warnings, seed_all, state, write_records)

N = 16


class Records(Dataset):
    def __init__(self, path):
        self.path = path
        self.file = open(path, "rb")

    def __getstate__(self):
        values = dict(self.__dict__)
        del values["file"]
        return values

    def __setstate__(self, values):
        self.__dict__.update(values)
        self.file = open(self.path, "rb")

    def __len__(self):
        return N

    def __getitem__(self, idx):
        raw = os.pread(self.file.fileno(), RECORD.size, idx * RECORD.size)
        key, value = RECORD.unpack(raw)
        return key, value, torch.rand(1)


def main():
    record_warnings()
    write_records("records.bin", N, 0.5)
    dataset = Records(os.path.abspath("records.bin"))
    seed_all(11)
    reference = key_value_pairs(DataLoader(dataset, batch_size=4, shuffle=True))
    seed_all(11)
    loader = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=num_workers())
    state("num_workers", loader.num_workers)
    batches = list(loader)
    print("BATCHES", digest_of(batches), flush=True)
    pairs = key_value_pairs(batches)
    state("matches_num_workers_0", pairs == reference)
    state("values_correct", all(v == k * 0.5 for kb, vb in pairs for k, v in zip(kb, vb)))
    finish()


if __name__ == "__main__":
    main()
