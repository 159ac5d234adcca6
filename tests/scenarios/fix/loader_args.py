"""A legacy training script: tuned for workers on a Linux box, run with its
debug setting (NUM_WORKERS=0). Without autosafe_torch it dies before the
first batch (prefetch_factor, persistent_workers, multiprocessing_context
and timeout need workers); pin_memory warns every epoch without CUDA.
"""

import hashlib
import os

import torch
from torch.utils.data import DataLoader, TensorDataset

NUM_WORKERS = int(os.environ.get("NUM_WORKERS", "0"))  # 0 while debugging


def checksum(loader, epochs=2):
    h = hashlib.sha256()
    for _ in range(epochs):
        for x, y in loader:
            h.update(x.numpy().tobytes() + y.numpy().tobytes())
    return h.hexdigest()


def main():
    torch.manual_seed(0)
    data = TensorDataset(torch.arange(96.).reshape(48, 2), torch.arange(48))
    loader = DataLoader(data, batch_size=5, shuffle=True,
                        num_workers=NUM_WORKERS, prefetch_factor=4,  # tuned on the cluster
                        persistent_workers=True, multiprocessing_context="fork",
                        timeout=60, pin_memory=True)
    print("BATCHES", checksum(loader), flush=True)


if __name__ == "__main__":
    main()
