"""An IterableDataset that shards itself by get_worker_info(), with random augmentation.

Each worker yields every num_workers-th sample from its own id: the samples,
their order and the augmentation all depend on the worker count and ids.
"""

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from _common import digest, finish, num_workers, record_warnings, seed_all, state


class ShardedStream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        wid, count = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(wid, self.n, count):
            yield torch.tensor([i, wid]), torch.rand(3)


def main():
    record_warnings()
    seed_all(0)
    loader = DataLoader(ShardedStream(24), batch_size=4, num_workers=num_workers())
    state("num_workers", loader.num_workers)
    digest(loader, epochs=2)
    finish()


if __name__ == "__main__":
    main()
