"""A DistributedDataParallel script for torchrun: gloo, a DistributedSampler,
2 epochs; the dataset reads fixed-size records from a file. Each rank prints
a sha256 over every batch it saw (BATCHES <rank> <hex>)."""

import hashlib
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

RECORD = 8192  # bytes per sample: one read buffer


def write_records(path, n):
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (n * RECORD,), dtype=torch.uint8, generator=g)
    with open(path + ".tmp", "wb") as f:
        f.write(bytes(data.tolist()))
    os.replace(path + ".tmp", path)


class RecordFile(Dataset):
    def __init__(self, path):
        self.path = path
        self.file = None  # opened in the process that reads
        self.n = os.path.getsize(path) // RECORD

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.file is None:
            self.file = open(self.path, "rb")
        self.file.seek(i * RECORD)
        record = torch.frombuffer(bytearray(self.file.read(RECORD)), dtype=torch.uint8)
        return record[:16].float() / 255


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    path = os.path.join(os.environ.get("DATA_DIR", tempfile.gettempdir()), "records.bin")
    if rank == 0:
        write_records(path, 64)
    dist.barrier()
    dataset = RecordFile(path)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2,
                        persistent_workers=True)
    model = DistributedDataParallel(torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = hashlib.sha256()
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x in loader:
            seen.update(x.numpy().tobytes())
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    # One write per line: torchrun runs the ranks unbuffered, on one stdout.
    sys.stdout.write("BATCHES %d %s\n" % (rank, seen.hexdigest()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
