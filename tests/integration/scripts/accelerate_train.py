"""An HF Accelerate training loop: Accelerator(cpu=True), prepare, autocast.
A dataset of records with a per-sample transform; 2 epochs. Prints a
sha256 over every batch the model saw (BATCHES)."""

import hashlib

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset


def scale(x):
    return x * 2 - 1


class Records(Dataset):
    def __init__(self, transform, n=48):
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand(n, 4, generator=g)
        self.transform = transform

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.transform(self.x[i])
        return x, x.sum(0, keepdim=True)


def main():
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    dataset = Records(transform=scale)
    loader = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=2)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    seen = hashlib.sha256()
    for _epoch in range(2):
        for x, y in loader:
            seen.update(x.float().numpy().tobytes())
            with accelerator.autocast():
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    print("BATCHES", seen.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
