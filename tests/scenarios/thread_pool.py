"""A dataset that decodes through a thread pool it made, and used, in __init__.

Under fork the workers inherit the pool without its threads and wait forever
on the first submit() (DataLoader's timeout turns that into an error here);
under spawn the pool does not pickle. argv[1]: the number of workers.
"""

import hashlib
import sys
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.utils.data import DataLoader, Dataset


def decode(i):
    return torch.arange(4.) * i


class PooledDataset(Dataset):
    def __init__(self):
        self.pool = ThreadPoolExecutor(2)
        self.pool.submit(decode, 0).result()  # warm it up: the pool now has threads

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return self.pool.submit(decode, i).result()


if __name__ == "__main__":
    import multiprocessing

    workers = int(sys.argv[1])
    hang = 8 if multiprocessing.get_start_method() == "fork" else 120  # fork: the hang
    loader = DataLoader(PooledDataset(), batch_size=4, num_workers=workers,
                        timeout=hang if workers else 0)
    h = hashlib.sha256()
    for batch in loader:
        h.update(batch.numpy().tobytes())
    print("BATCHES", h.hexdigest(), flush=True)
