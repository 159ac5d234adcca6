"""A dataset that waits until all N workers have fetched (PyTorch's test_get_worker_info
and test_worker_seed): a shared counter and a semaphore.

Each fetch blocks until N fetches happened: a fetch outside the N workers
(the parent) or fewer than N workers never gets there. It gives up after a
timeout, so a broken run fails with a message instead of hanging.
"""

import multiprocessing
import os

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from _common import digest_of, finish, num_workers, record_warnings, seed_all, state

WAIT_S = 15


class Synchronized(Dataset):
    def __init__(self, size, workers):
        self.count = multiprocessing.Value("i", 0, lock=True)
        self.barrier = multiprocessing.Semaphore(0)
        self.workers = workers
        self.size = size

    def sync_once(self):
        with self.count.get_lock():
            self.count.value += 1
            if self.count.value == self.workers:
                self.barrier.release()
        if not self.barrier.acquire(timeout=WAIT_S):
            info = get_worker_info()
            raise RuntimeError("barrier: %d of %d arrived after %d s (pid %d, worker %s)" % (
                self.count.value, self.workers, WAIT_S, os.getpid(),
                info.id if info is not None else "none: the parent"))
        self.barrier.release()

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        self.sync_once()
        info = get_worker_info()
        return idx, info.id, torch.initial_seed(), torch.rand(2)


def main():
    record_warnings()
    seed_all(3)
    workers = num_workers()
    dataset = Synchronized(2 * workers, workers)
    loader = DataLoader(dataset, batch_size=1, num_workers=workers)
    state("num_workers", loader.num_workers)
    seeds = set()
    batches = []
    for batch in loader:
        batches.append(batch)
        seeds.add(int(batch[2]))
    state("distinct_worker_seeds", len(seeds))
    state("fetches_seen_by_counter", dataset.count.value)
    print("BATCHES", digest_of(batches), flush=True)
    finish()


if __name__ == "__main__":
    main()
