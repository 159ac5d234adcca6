"""A dataset with every kind of randomness a worker can have, made unpicklable
in one ordinary way (argv[1]: lock, lambda, file or generator; plain: none).

Each sample carries: the index, the worker id and seed, draws from torch's
and Python's and numpy's global generators, from a per-object numpy
RandomState and Generator, and a value the worker_init_fn set. The batches
therefore depend on which worker fetched what, with which seed: only the
requested workers, faithfully, give the reference digest.

Run: python faithful.py KIND [WORKERS]; prints BATCHES <sha256> and the
parent's RNG digest after the epoch (RNG <sha256>).
"""

import hashlib
import os
import random
import sys
import threading

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(os.environ.get("SCENARIO_TMP", HERE), "faithful.bin")


class Augmented(Dataset):
    def __init__(self, kind):
        self.state = np.random.RandomState(7)
        self.gen = np.random.default_rng(11)
        self.offset = 0.0
        if kind == "lock":
            self.lock = threading.Lock()
        elif kind == "lambda":
            self.transform = lambda x: x * 2
        elif kind == "generator":  # a spent iterator kept on the dataset: fork is fine
            self.pending = (x for x in range(3))
        elif kind == "file":
            if not os.path.exists(DATA):
                with open(DATA, "wb") as f:
                    f.write(bytes(range(256)))
            self.f = open(DATA, "rb")

    def __len__(self):
        return 24

    def __getitem__(self, i):
        info = get_worker_info()
        byte = 0
        if hasattr(self, "f"):
            # os.pread: forked workers share the file's offset, and a seek then a
            # read would race between them (the fork reference's bytes by chance)
            byte = os.pread(self.f.fileno(), 1, i)[0]
        values = [float(i), float(info.id), float(info.seed % 1000), float(byte), self.offset,
                  torch.rand(1).item(), random.random(), float(np.random.rand()),
                  float(self.state.rand()), float(self.gen.random())]
        x = torch.tensor(values)
        return self.transform(x) if hasattr(self, "transform") else x


def init_worker(worker_id):
    get_worker_info().dataset.offset = 100.0 + worker_id + random.random()


def main():
    kind = sys.argv[1]
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    loader = DataLoader(Augmented(kind), batch_size=4, num_workers=workers,
                        worker_init_fn=init_worker, shuffle=True)
    h = hashlib.sha256()
    for _epoch in range(2):
        for batch in loader:
            h.update(batch.numpy().tobytes())
    print("BATCHES", h.hexdigest(), flush=True)
    rng = hashlib.sha256(torch.get_rng_state().numpy().tobytes())
    rng.update(repr(random.getstate()).encode())
    rng.update(repr(np.random.get_state()[1][:8]).encode())
    print("RNG", rng.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
