"""Datasets that hold, from __init__, what a spawned worker cannot receive.

python holders.py KIND [lazy|changed]

KIND (data written to ``SCENARIO_TMP``):

- ``parquet``: a pyarrow ``ParquetFile`` (rows read by row group);
- ``safetensors``: a safetensors ``safe_open`` handle (rows sliced);
- ``pandas``: a pandas ``read_csv(chunksize=4)`` reader, as an IterableDataset
  whose workers take every other chunk;
- ``handler``: a ``RotatingFileHandler`` each sample writes an audit line to;
- ``anonmap``: an anonymous ``mmap.mmap(-1, n)`` filled in __init__;
- ``pread``: a raw ``os.open()`` descriptor read with ``os.pread`` (no offset moves).

``lazy``: the hand fix, each holder made in the process that uses it (the
known-safe twin). ``changed``: the parent reads the first sample before the
loader starts (a reader advanced, for ``pandas``: its state is no longer
what construction gives).

Each sample: the row's values, the worker id, per-worker seeded draws
(torch, random, numpy) and the worker's pid. Prints ``BATCHES <sha256>``,
``PIDS <worker processes that fetched, not this one>`` and, for ``handler``,
``AUDIT <lines written>``.
"""

import hashlib
import logging
import logging.handlers
import mmap
import os
import random
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

ROWS, WIDTH = 24, 3


def values(i):
    return [float(i * WIDTH + k) * 0.5 for k in range(WIDTH)]


def sample(row, i):
    info = get_worker_info()
    noise = [torch.rand(1).item(), random.random(), float(np.random.rand())]
    return torch.tensor(list(row) + [float(i), float(info.id if info else -1)] + noise), \
        os.getpid()


class Holder(Dataset):
    """One holder per process when lazy; made in __init__ otherwise."""

    def __init__(self, path, lazy=False):
        self.path, self.lazy, self.pid = path, lazy, None
        self.held = None if lazy else self.open()

    def get(self):
        if self.lazy and self.pid != os.getpid():
            self.held, self.pid = self.open(), os.getpid()
        return self.held

    def __len__(self):
        return ROWS


class Parquet(Holder):
    def open(self):
        import pyarrow.parquet as pq

        return pq.ParquetFile(self.path)

    def __getitem__(self, i):
        table = self.get().read_row_group(i // 4)
        return sample([table.column(k)[i % 4].as_py() for k in range(WIDTH)], i)


class SafeTensors(Holder):
    def open(self):
        from safetensors import safe_open

        return safe_open(self.path, framework="pt")

    def __getitem__(self, i):
        return sample(self.get().get_slice("rows")[i].tolist(), i)


class AuditLog(Holder):
    def open(self):
        handler = logging.handlers.RotatingFileHandler(self.path, maxBytes=1 << 20,
                                                       backupCount=1)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        return handler

    def __getitem__(self, i):
        self.get().handle(logging.makeLogRecord({"msg": "sample %d" % i, "levelno": 20,
                                                 "levelname": "INFO"}))
        return sample(values(i), i)


class AnonymousMap(Holder):
    def open(self):
        m = mmap.mmap(-1, ROWS * WIDTH * 8)
        m.write(np.array([values(i) for i in range(ROWS)], dtype=np.float64).tobytes())
        m.seek(0)
        return m

    def __getitem__(self, i):
        at = i * WIDTH * 8
        return sample(np.frombuffer(self.get()[at:at + WIDTH * 8], dtype=np.float64), i)


class Descriptor(Holder):
    def open(self):
        return os.open(self.path, os.O_RDONLY)

    def __getitem__(self, i):
        raw = os.pread(self.get(), WIDTH * 8, i * WIDTH * 8)
        return sample(np.frombuffer(raw, dtype=np.float64), i)


class CsvChunks(IterableDataset):
    def __init__(self, path, lazy=False):
        import pandas as pd

        self.path, self.lazy = path, lazy
        self.reader = None if lazy else pd.read_csv(path, chunksize=4)

    def __iter__(self):
        import pandas as pd

        reader = pd.read_csv(self.path, chunksize=4) if self.lazy else self.reader
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for k, chunk in enumerate(reader):
            if k % workers == worker:
                for i, row in zip(chunk.index, chunk.itertuples(index=False)):
                    yield sample(list(row), int(i))


def write_data(kind, tmp):
    rows = np.array([values(i) for i in range(ROWS)], dtype=np.float64)
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = os.path.join(tmp, "rows.parquet")
        pq.write_table(pa.table({"c%d" % k: rows[:, k] for k in range(WIDTH)}), path,
                       row_group_size=4)
    elif kind == "safetensors":
        from safetensors.torch import save_file

        path = os.path.join(tmp, "rows.safetensors")
        save_file({"rows": torch.from_numpy(rows)}, path)
    elif kind == "pandas":
        import pandas as pd

        path = os.path.join(tmp, "rows.csv")
        pd.DataFrame(rows, columns=["c%d" % k for k in range(WIDTH)]).to_csv(path, index=False)
    elif kind == "pread":
        path = os.path.join(tmp, "rows.bin")
        rows.tofile(path)
    else:
        path = os.path.join(tmp, "audit.log")
    return path


KINDS = {"parquet": Parquet, "safetensors": SafeTensors, "pandas": CsvChunks,
         "handler": AuditLog, "anonmap": AnonymousMap, "pread": Descriptor}


def main():
    kind, mode = sys.argv[1], (sys.argv[2:3] or [""])[0]
    tmp = os.environ.get("SCENARIO_TMP", ".")
    path = write_data(kind, tmp)
    torch.manual_seed(0)
    dataset = KINDS[kind](path, lazy=(mode == "lazy"))
    if mode == "changed":
        next(iter(dataset)) if kind == "pandas" else dataset[0]
    shuffle = kind != "pandas"
    loader = DataLoader(dataset, batch_size=4, shuffle=shuffle, num_workers=2)
    model = torch.nn.Linear(WIDTH + 5, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    h, pids = hashlib.sha256(), set()
    for x, pid in loader:
        h.update(x.numpy().tobytes())
        pids.update(pid.tolist())
        optimizer.zero_grad()
        model(x.float()).square().mean().backward()
        optimizer.step()
    print("BATCHES", h.hexdigest(), flush=True)
    print("PIDS", len(pids - {os.getpid()}), flush=True)
    if kind == "handler":
        logging.shutdown()
        with open(path) as f:
            print("AUDIT", len(f.read().splitlines()), flush=True)


if __name__ == "__main__":
    main()
