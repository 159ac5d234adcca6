"""The datasets of the worker-ladder tests (tests/test_workers.py).

Each is ordinary legacy code with one worker hazard. Their data file lives in
the working directory of the run (the test's tmp_path).
"""

import os
import threading
import time

import torch
from torch.utils.data import Dataset, IterableDataset

PATH = os.path.abspath("data.bin")
# Item i lies at i * STRIDE: more than one read buffer (8 KiB) apart, so every
# seek and read reaches the OS and the shared offset (DL207), on every item.
# STRIDE = 32 * 256 + 8: item i holds the bytes i*8 .. i*8+7 (mod 256), as before.
STRIDE = 8200
if not os.path.exists(PATH):
    with open(PATH, "wb") as f:
        f.write(bytes(range(256)) * (32 * STRIDE // 256 + 1))


class FileDataset(Dataset):
    """Holds an open file it seeks and reads: the classic legacy dataset."""
    def __init__(self, slow=0.0):
        self.f = open(PATH, "rb")
        self.slow = slow
    def __len__(self):
        return 32
    def __getitem__(self, i):
        self.f.seek(i * STRIDE)
        if self.slow:
            time.sleep(self.slow)
        return torch.tensor(list(self.f.read(8)))


def idle_thread():
    """A live thread (a cache refresher, a prefetcher): a forked child has none."""
    thread = threading.Thread(target=threading.Event().wait, daemon=True)
    thread.start()
    return thread


class LockedDataset(Dataset):
    """Holds a lock (a cache guard) and the live thread that refreshes the cache:
    does not pickle, and fork is unsafe (a forked worker has no thread behind it)."""
    def __init__(self):
        self.lock = threading.Lock()
        self.refresher = idle_thread()
        self.data = torch.arange(64.).reshape(32, 2)
    def __len__(self):
        return 32
    def __getitem__(self, i):
        with self.lock:
            return self.data[i] * 2


class GeneratorDataset(Dataset):
    """Holds a generator: does not pickle; fork is fine."""
    def __init__(self):
        self.gen = (x for x in range(3))
        self.data = torch.arange(64.).reshape(32, 2)
    def __len__(self):
        return 32
    def __getitem__(self, i):
        return self.data[i] + 1


class LockedStream(IterableDataset):
    def __init__(self):
        self.lock = threading.Lock()
        self.refresher = idle_thread()
    def __iter__(self):
        return iter(torch.arange(12.).reshape(6, 2))
