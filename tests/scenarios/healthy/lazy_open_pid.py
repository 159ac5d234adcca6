"""A dataset that opens its file lazily, once per process (checking os.getpid()),
then seeks and reads. Correct under every start method: a forked worker
that inherits the parent's handle sees another pid and opens its own; a
pickled copy (spawn, forkserver) leaves the handle behind.

The script first reads it with num_workers=0 (the known-safe run), which
leaves the parent's handle open, as a training script's evaluation would.
"""

import os

import torch
from torch.utils.data import DataLoader, Dataset

from _common import (RECORD, digest_of, finish, key_value_pairs, num_workers,
                     record_warnings, seed_all, state, write_records)

N = 16


class LazyRecords(Dataset):
    def __init__(self, path):
        self.path = path
        self.file = None
        self.pid = None

    def __getstate__(self):
        # A handle does not travel (spawn, forkserver): the receiver opens its own.
        values = dict(self.__dict__)
        values["file"] = values["pid"] = None
        return values

    def _handle(self):
        if self.pid != os.getpid():
            self.file = open(self.path, "rb")
            self.pid = os.getpid()
        return self.file

    def __len__(self):
        return N

    def __getitem__(self, idx):
        handle = self._handle()
        handle.seek(idx * RECORD.size)
        key, value = RECORD.unpack(handle.read(RECORD.size))
        return key, value, torch.rand(1)


def main():
    record_warnings()
    write_records("records.bin", N, 0.25)
    dataset = LazyRecords(os.path.abspath("records.bin"))
    seed_all(12)
    reference = key_value_pairs(DataLoader(dataset, batch_size=4, shuffle=True))
    state("parent_opened", dataset.file is not None)
    seed_all(12)
    loader = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=num_workers())
    state("num_workers", loader.num_workers)
    batches = list(loader) + list(loader)
    print("BATCHES", digest_of(batches), flush=True)
    pairs = key_value_pairs(batches[: len(batches) // 2])
    state("matches_num_workers_0", pairs == reference)
    state("values_correct", all(v == k * 0.25 for kb, vb in key_value_pairs(batches)
                                for k, v in zip(kb, vb)))
    finish()


if __name__ == "__main__":
    main()
