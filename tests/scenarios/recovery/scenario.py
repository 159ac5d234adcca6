"""A loader whose batches show any mistake in a recovery, and one fault.

python scenario.py FAULT [EPOCHS]; FAULT is one of:

- none: healthy (the reference, and the control);
- kill: the training loop kills worker 1 with SIGKILL after batch 3, as the
  out-of-memory killer would;
- segv: a worker process segfaults (ctypes) on index 13, every time, as a
  library that is not fork-safe would; the main process does not;
- hang: a worker process waits forever on index 13; the main process does not;
- shm: 1 MiB batches, for a /dev/shm too small (the test mounts one);
- fds: per-sample tensors kept by the program, for a low open-file limit;
- valueerror: __getitem__ raises ValueError on index 13, everywhere (the user's bug);
- memory: a worker process raises MemoryError on index 13, once in the run (memory
  pressure that passes); memory-always: every time, in every worker process;
- startup: a spawned worker's import of this module (``__mp_main__``) raises, as a
  module-level import of a library missing in new processes would; every worker
  dies while starting, before any of its steps.

Every sample carries its index, the worker id and seed, draws from torch's,
Python's and numpy's global generators (seeded per worker), from a numpy
RandomState the dataset owns, and the dataset copy's fetch count: a batch
fetched by the wrong worker, with the wrong state, lost or repeated changes
the checksum. Prints BATCHES <sha256> (every batch of every epoch, in order).
"""

import ctypes
import hashlib
import os
import random
import signal
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

TMP = os.environ.get("SCENARIO_TMP", ".")
BAD_INDEX = 13
BIG = 64 * 1024  # floats per sample for shm: 4 samples = 1 MiB


def in_worker_process():
    return os.getpid() != int(os.environ["SCENARIO_PARENT_PID"])


def first_time(what, again=False):
    """True the first time in this run (a marker file per run), or always."""
    marker = os.path.join(TMP, "%s-%s" % (what, os.environ["SCENARIO_PARENT_PID"]))
    if os.path.exists(marker) and not again:
        return False
    open(marker, "w").close()
    return True


class Augmented(Dataset):
    def __init__(self, fault, n=48):
        self.fault = fault
        self.n = n
        self.state = np.random.RandomState(5)
        self.fetches = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = get_worker_info()
        self.fetches += 1
        if self.fault == "kill" and self.fetches == 1:
            with open(os.path.join(TMP, "pid-%d" % info.id), "w") as f:
                f.write(str(os.getpid()))
        if i == BAD_INDEX:
            if self.fault == "segv" and in_worker_process():
                ctypes.string_at(0)
            if self.fault == "hang" and in_worker_process():
                time.sleep(3600)
            if self.fault == "valueerror":
                raise ValueError("bad sample %d" % i)
            if self.fault.startswith("memory") and in_worker_process() and first_time(
                    "memory", again=self.fault == "memory-always"):
                raise MemoryError("Unable to allocate 1.00 GiB for an array with shape "
                                  "(134217728,) and data type float64")
        values = torch.tensor([float(i), float(info.id), float(info.seed % 10007),
                               torch.rand(1).item(), random.random(), float(np.random.rand()),
                               float(self.state.rand()), float(self.fetches)])
        if self.fault == "shm":
            return values.repeat(BIG // 8)
        return values


def per_sample(batch):
    """A collate function that keeps one tensor per sample (one shared storage each)."""
    return [s.clone() for s in batch]


def main():
    fault = sys.argv[1]
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    os.environ["SCENARIO_PARENT_PID"] = str(os.getpid())
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    loader = DataLoader(Augmented(fault, n=400 if fault == "fds" else 48), batch_size=4,
                        shuffle=True, num_workers=2,
                        collate_fn=per_sample if fault == "fds" else None)
    h = hashlib.sha256()
    killed = False
    start = time.monotonic()
    for _ in range(epochs):
        kept = []
        for number, batch in enumerate(loader):
            if fault == "kill" and number == 3 and not killed:
                with open(os.path.join(TMP, "pid-1")) as f:
                    os.kill(int(f.read()), signal.SIGKILL)
                killed = True
            kept.append(batch)  # fds: the program keeps every batch
        for batch in kept:
            for part in (batch if isinstance(batch, list) else [batch]):
                h.update(part.numpy().tobytes())
    print("BATCHES", h.hexdigest(), flush=True)
    print("SECONDS %.2f" % (time.monotonic() - start), flush=True)
    rng = hashlib.sha256(torch.get_rng_state().numpy().tobytes())
    rng.update(repr(random.getstate()).encode())
    print("RNG", rng.hexdigest(), flush=True)


if __name__ == "__mp_main__" and sys.argv[1:2] == ["startup"]:
    raise ImportError("libscenario.so: cannot open shared object file")

if __name__ == "__main__":
    main()
