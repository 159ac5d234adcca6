"""Shared by the process-state scenarios: the training loop, and what it prints.

Each scenario is an ordinary script whose ``main()`` sets something the
workers' code reads (or, for a control, nothing they read). ``train`` runs two
epochs as a training script does: the model and its optimizer built after the
loader, a real step per batch. It prints

- ``BATCHES <sha256>`` over every batch, in order: its values and their dtype,
  the worker that made each sample;
- ``PIDS <n>``: how many processes other than this one made samples (real
  workers: 2 per epoch of a loader with 2 workers that do not persist).
"""

import hashlib
import os

import torch
from torch.utils.data import get_worker_info

EPOCHS = 2


def sample(x):
    """A sample as the scenarios return it: the values, who made them."""
    info = get_worker_info()
    return x, info.id if info is not None else -1, os.getpid()


def train(loader, before_epoch=None):
    """``before_epoch(epoch)``: what main() changes before each epoch."""
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    h, pids = hashlib.sha256(), set()
    for epoch in range(EPOCHS):
        if before_epoch is not None:
            before_epoch(epoch)
        for x, worker, pid in loader:
            h.update(str(x.dtype).encode() + x.numpy().tobytes() + worker.numpy().tobytes())
            pids.update(pid.tolist())
            optimizer.zero_grad()
            model(x.to(model.weight.dtype)).square().mean().backward()
            optimizer.step()
    print("BATCHES", h.hexdigest(), flush=True)
    print("PIDS", len(pids - {os.getpid()}), flush=True)
