"""A legacy data pipeline: the dataset opens its data file once, in __init__.

Written on Linux, where DataLoader workers fork and nothing is pickled, it
works there. On macOS and Windows (and on Linux from Python 3.14, with
forkserver) workers are spawned and the dataset is pickled:

    TypeError: cannot pickle '_io.BufferedReader' object

The hand fix is num_workers=0, and the pipeline loses its workers.
autosafe_torch keeps them: the read-only file travels by path and each
worker reopens it (DL201).
"""

import os
import tempfile

import torch
from torch.utils.data import DataLoader, Dataset

RECORD = 64  # bytes per sample


def write_records(path, n):
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (n * RECORD,), dtype=torch.uint8, generator=g)
    with open(path, "wb") as f:
        f.write(bytes(data.tolist()))  # torch alone: the demo installs no numpy


class RecordFile(Dataset):
    def __init__(self, path):
        self.file = open(path, "rb")  # opened once, in the parent
        self.n = os.path.getsize(path) // RECORD

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.file.seek(i * RECORD)
        record = torch.frombuffer(bytearray(self.file.read(RECORD)), dtype=torch.uint8)
        return record.float().div(255).reshape(8, 8)


def main():
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "records.bin")
        write_records(path, 512)
        loader = DataLoader(RecordFile(path), batch_size=64, num_workers=2)
        total = sum(batch.sum().item() for batch in loader)
        print("read %d batches, checksum %.4f" % (len(loader), total))


if __name__ == "__main__":
    main()
