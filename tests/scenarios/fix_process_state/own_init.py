"""A seed main() sets, read by the loader's own worker_init_fn (which gives
the dataset its generator), and a label map main() fills in place, read by
__getitem__. A spawned worker has SEED 0 and an empty map."""

import hashlib
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

SEED = 0
LABELS = {}


class Noisy(Dataset):
    names = ["cat", "dog", "owl"]
    rng = None  # each worker's, from seed_worker

    def __len__(self):
        return 24

    def __getitem__(self, i):
        label = LABELS.get(self.names[i % 3], -1)
        return torch.from_numpy(self.rng.normal(size=4)) + i + 100 * label


def seed_worker(worker_id):
    get_worker_info().dataset.rng = np.random.default_rng(SEED + worker_id)


def main():
    global SEED
    SEED = int(sys.argv[1]) if len(sys.argv) > 1 else 1234
    for k, name in enumerate(sorted(Noisy.names)):
        LABELS[name] = k
    torch.manual_seed(0)
    loader = DataLoader(Noisy(), batch_size=4, shuffle=True, num_workers=2,
                        worker_init_fn=seed_worker)
    h = hashlib.sha256()
    for _epoch in range(2):
        for batch in loader:
            h.update(batch.numpy().tobytes())
    print("BATCHES", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
