"""A dataset that holds an open file and pickles correctly: __getstate__ drops the
handle, __setstate__ reopens it by path. It reads with os.pread (no shared
file offset), so it is also correct under fork, where nothing is pickled.

Checked against the known-safe run: num_workers=0 in the same script.
"""

import os
import struct

import torch
from torch.utils.data import DataLoader, Dataset

from _common import digest_of, finish, num_workers, record_warnings, seed_all, state

RECORD = struct.Struct("<qd")
N = 16


def write_data(path):
    with open(path, "wb") as out:
        for i in range(N):
            out.write(RECORD.pack(i, i * 0.5))


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


def plain(batches):
    """(key, value) pairs, without the augmentation (which depends on the workers)."""
    return [(k.tolist(), v.tolist()) for k, v, _ in batches]


def main():
    record_warnings()
    write_data("records.bin")
    dataset = Records(os.path.abspath("records.bin"))
    seed_all(11)
    reference = plain(DataLoader(dataset, batch_size=4, shuffle=True))
    seed_all(11)
    loader = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=num_workers())
    state("num_workers", loader.num_workers)
    batches = list(loader)
    print("BATCHES", digest_of(batches), flush=True)
    pairs = plain(batches)
    state("matches_num_workers_0", pairs == reference)
    state("values_correct", all(v == k * 0.5 for kb, vb in pairs for k, v in zip(kb, vb)))
    finish()


if __name__ == "__main__":
    main()
