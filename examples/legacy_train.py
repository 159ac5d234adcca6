"""A legacy training script, as found in the wild.

Written for an older PyTorch on a Linux box with workers; run today with
its debug setting (num_workers=0), it dies before the first batch:

    ValueError: prefetch_factor option could only be specified in
    multiprocessing.let num_workers > 0 to enable multiprocessing, ...

Run it as is with ``autosafe-torch run examples/legacy_train.py`` and it
trains, with the same batches, and a log line that says what to change.
"""

import os

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

NUM_WORKERS = int(os.environ.get("NUM_WORKERS", "0"))  # 0 while debugging


class SquaresDataset(Dataset):
    def __init__(self, n=256):
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand(n, 8, generator=g)
        self.y = (self.x ** 2).sum(dim=1, keepdim=True)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    torch.manual_seed(0)
    loader = DataLoader(SquaresDataset(), batch_size=32, shuffle=True,
                        num_workers=NUM_WORKERS, prefetch_factor=4,
                        persistent_workers=True, pin_memory=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(3):
        total = 0.0
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            total += loss.item()
        print("epoch %d loss %.4f" % (epoch, total / len(loader)))


if __name__ == "__main__":
    main()
