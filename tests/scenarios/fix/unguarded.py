"""A legacy script with its training code at top level, no main guard.

Fine under fork. Spawned workers (macOS, Windows, Linux from Python 3.14)
import the script again and would start workers of their own ("An attempt
has been made to start a new process before the current process has
finished its bootstrapping phase."); first, its lambda does not pickle.
"""

import hashlib

import torch
from torch.utils.data import DataLoader, Dataset

NOISE = 0.01  # read by the dataset, in every worker


class Noisy(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        # random augmentation: the batches depend on each worker's seed
        return torch.full((4,), float(i)) + NOISE * torch.rand(4)


torch.manual_seed(0)
loader = DataLoader(Noisy(), batch_size=4, shuffle=True, num_workers=2,
                    collate_fn=lambda samples: torch.stack(samples) * 2)
h = hashlib.sha256()
for _epoch in range(1):
    for batch in loader:
        h.update(batch.numpy().tobytes())
print("BATCHES", h.hexdigest(), flush=True)
