"""A dataset holding a multiprocessing Queue, Lock and Value.

Workers report each fetch on the queue and count them under the lock; the
parent reads both after the run. multiprocessing lets these objects travel
to a child at process start (fork, spawn and forkserver alike).
"""

import multiprocessing
import queue as queue_module

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from _common import digest, finish, num_workers, record_warnings, seed_all, state


class Reporting(Dataset):
    def __init__(self):
        self.queue = multiprocessing.Queue()
        self.lock = multiprocessing.Lock()
        self.fetches = multiprocessing.Value("i", 0, lock=False)

    def __len__(self):
        return 12

    def __getitem__(self, idx):
        info = get_worker_info()
        wid = info.id if info is not None else -1
        with self.lock:
            self.fetches.value += 1
        self.queue.put((idx, wid))
        return idx, wid, torch.rand(2)


def main():
    record_warnings()
    seed_all(10)
    dataset = Reporting()
    loader = DataLoader(dataset, batch_size=3, num_workers=num_workers())
    state("num_workers", loader.num_workers)
    digest(loader)
    reported = []
    try:
        while len(reported) < 12:
            reported.append(dataset.queue.get(timeout=15))
        reported.append(dataset.queue.get(timeout=0.5))  # one too many?
    except queue_module.Empty:
        pass
    state("reported", sorted(reported))
    state("fetch_count", dataset.fetches.value)
    finish()


if __name__ == "__main__":
    main()
