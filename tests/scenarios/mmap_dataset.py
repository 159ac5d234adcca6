"""A dataset holding ``mmap.mmap`` objects of named files (DL201), run as it is.

``python mmap_dataset.py KIND``, data in ``SCENARIO_TMP``:

- ``maps``: an ``IterableDataset`` that reads fixed-size records from the
  current position of three maps: ``ACCESS_READ`` at a nonzero offset and
  past a header the parent skipped (``seek``), a shared writable map of a
  file opened ``'r+b'`` (a per-record scale), and an ``ACCESS_COPY`` map
  the parent only read. Each worker reads its shard (record index modulo
  the number of workers) and adds random noise (``torch.rand``: per-worker
  seeds), and prints ``WORKER real=<bool>``: whether it runs in a process
  of its own.
- ``written``: the same, but the parent wrote to its ``ACCESS_COPY`` map:
  its change is in no file, so no worker can map it again from there.

A map does not pickle: under spawn, without autosafe_torch, starting the
workers fails (``TypeError: cannot pickle 'mmap.mmap' object``); under fork
each worker holds the parent's maps at their positions. ``BATCHES`` as ever.
"""

import hashlib
import mmap
import os
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

HEADER, RECORD, RECORDS = 24, 64, 120


class Records(IterableDataset):
    def __init__(self, kind, data, scales):
        with open(data, "rb") as f:
            # Past the first page, as a map of a large file's second part is.
            self.frames = mmap.mmap(f.fileno(), HEADER + RECORD * RECORDS,
                                    access=mmap.ACCESS_READ, offset=mmap.ALLOCATIONGRANULARITY)
            self.lookup = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        self.frames.seek(HEADER)  # the parent read the header: records start here
        with open(scales, "r+b") as f:
            self.scales = mmap.mmap(f.fileno(), 0)  # shared, writable
        if kind == "written":
            self.lookup[0] = 255  # private to this process: in no file

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        if info is not None:
            print("WORKER real=%s" % (str(os.getpid()) != os.environ["SCENARIO_PARENT"]),
                  flush=True)
        index = 0
        while True:
            record = self.frames.read(RECORD)
            if len(record) < RECORD:
                return
            if index % workers == worker:
                values = torch.frombuffer(bytearray(record), dtype=torch.uint8).float()
                scale = self.scales[index % len(self.scales)] + self.lookup[index]
                yield values * scale + torch.rand(1), index
            index += 1


def main():
    kind = sys.argv[1]
    tmp = os.environ.get("SCENARIO_TMP", ".")
    data, scales = os.path.join(tmp, "frames.bin"), os.path.join(tmp, "scales.bin")
    rng = np.random.default_rng(3)
    rng.integers(0, 256, mmap.ALLOCATIONGRANULARITY + HEADER + RECORD * RECORDS,
                 dtype=np.uint8).tofile(data)
    rng.integers(1, 9, 37, dtype=np.uint8).tofile(scales)
    os.environ["SCENARIO_PARENT"] = str(os.getpid())
    torch.manual_seed(0)
    loader = DataLoader(Records(kind, data, scales), batch_size=8, num_workers=2)
    h = hashlib.sha256()
    for batch, index in loader:
        h.update(batch.numpy().tobytes())
        h.update(index.numpy().tobytes())
    print("BATCHES", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
