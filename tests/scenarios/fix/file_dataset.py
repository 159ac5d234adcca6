"""A dataset that opens its data file once, in __init__, then seeks and reads.

Under spawn (macOS, Windows, Linux from Python 3.14) the dataset is pickled
for each worker: "TypeError: cannot pickle '_io.BufferedReader' object".
Under fork, the workers share the file's offset and can read each other's
records.
"""

import hashlib
import os
import tempfile

import torch
from torch.utils.data import DataLoader, Dataset

RECORD = 32  # bytes per sample


class Records(Dataset):
    """Fixed-size records of a binary file."""

    def __init__(self, path):
        self.file = open(path, "rb")  # opened once, in the parent
        self.n = os.path.getsize(path) // RECORD

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.file.seek(i * RECORD)
        data = bytearray(self.file.read(RECORD))
        return torch.frombuffer(data, dtype=torch.uint8).float() + torch.rand(RECORD)


def main():
    path = os.path.join(tempfile.mkdtemp(), "records.bin")
    with open(path, "wb") as f:
        f.write(bytes(i % 251 for i in range(RECORD * 64)))
    torch.manual_seed(0)
    loader = DataLoader(Records(path), batch_size=8, shuffle=True, num_workers=2)
    h = hashlib.sha256()
    for _epoch in range(1):
        for batch in loader:
            h.update(batch.numpy().tobytes())
    print("BATCHES", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
