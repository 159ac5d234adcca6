"""in_order=False (torch >= 2.6): batches arrive as workers finish them.

Both the order and which worker fetches which sample vary from run to run
(torch skips a worker with too many tasks in flight), so the samples are
compared as a set, with an augmentation drawn from the workers' base seed
and the index alone; the worker count and the ids that served are compared.
"""

import inspect
import time

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from _common import digest_of, finish, num_workers, record_warnings, seed_all, state


class SlowFirst(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, idx):
        if idx == 0:
            time.sleep(0.2)  # worker 0 falls behind: the others overtake it
        info = get_worker_info()
        base_seed = info.seed - info.id  # the same in every worker: drawn by the parent
        aug = torch.rand(2, generator=torch.Generator().manual_seed(base_seed + 1000 * idx))
        return idx, info.id, aug


def main():
    record_warnings()
    seed_all(5)
    if "in_order" not in inspect.signature(DataLoader.__init__).parameters:
        state("in_order", "not in this torch")
        finish()
        return
    loader = DataLoader(SlowFirst(), batch_size=2, num_workers=num_workers(), in_order=False)
    state("num_workers", loader.num_workers)
    samples = []
    workers = set()
    for idx, wid, aug in loader:
        samples.extend(zip(idx.tolist(), aug.tolist()))
        workers.update(wid.tolist())
    state("samples", len(samples))
    state("worker_ids", sorted(workers))
    print("BATCHES", digest_of(sorted(samples)), flush=True)
    finish()


if __name__ == "__main__":
    main()
