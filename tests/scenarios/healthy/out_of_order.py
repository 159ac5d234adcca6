"""in_order=False (torch >= 2.6): batches arrive as workers finish them.

The order varies from run to run, so the batches are compared as a set;
which worker fetched which sample (round robin) and its augmentation do not.
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
        return idx, get_worker_info().id, torch.rand(2)


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
    for idx, wid, aug in loader:
        samples.extend(zip(idx.tolist(), wid.tolist(), aug.tolist()))
    state("samples", len(samples))
    print("BATCHES", digest_of(sorted(samples)), flush=True)
    finish()


if __name__ == "__main__":
    main()
