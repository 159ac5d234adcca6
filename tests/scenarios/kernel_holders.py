"""Datasets that hold a file where no object walk looks (issue 26).

argv: KIND MODE [WORKERS [EPOCHS]].

KIND, what holds the file opened in ``__init__``:

- ``rawfd``: a descriptor from ``os.open()``, read with ``os.lseek`` + ``os.read``;
- ``rplus``: a file opened ``'r+b'`` that training only reads;
- ``tempfile``: a ``tempfile.NamedTemporaryFile('w+b')`` the dataset wrote its
  records to, then reads;
- ``partial``: a ``functools.partial(read_record, fh)``;
- ``closure``: a nested function's closure cell;
- ``weakproxy``: a ``weakref.proxy`` to a handle a module-level pool owns;
- ``csv``: an IterableDataset holding only ``csv.reader(open(...))``, sharded
  by ``get_worker_info()``;
- ``soundfile``: ``soundfile.SoundFile`` (libsndfile holds the descriptor).

MODE ``held`` is the legacy code (opened once, in the parent); ``twin`` the
safe twin, opening on first use in the process that reads; ``emulated``
iterates the held dataset with autosafe_torch's emulated workers directly.

Every sample is its own record read at its own place plus a draw from
torch's global generator (seeded per worker): a shared file offset shows as
other bytes, a wrong worker seed as other draws. Prints ``BATCHES <sha256>``
and ``ROWS <n>``; data files go to SCENARIO_TMP.
"""

import csv
import functools
import hashlib
import os
import sys
import tempfile
import time
import weakref

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

TMP = os.environ.get("SCENARIO_TMP", ".")
RECORDS = 48
RECORD = 9000  # more than a read buffer: every read reaches the kernel's offset
SLOW_S = 0.002  # the work between seeking and reading
KINDS = ("rawfd", "rplus", "tempfile", "partial", "closure", "weakproxy", "csv", "soundfile")


def record(i):
    return bytes((i * 7 + j) % 251 for j in range(RECORD))


def data_path(kind):
    suffix = {"csv": ".csv", "soundfile": ".wav"}.get(kind, ".bin")
    path = os.path.join(TMP, "records" + suffix)
    if not os.path.exists(path):
        _write(kind, path + ".part")
        os.replace(path + ".part", path)
    return path


FRAMES = 2000  # per record, in the sound file


def _write(kind, path):
    if kind == "csv":
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            for i in range(RECORDS * 20):
                writer.writerow([i, record(i % RECORDS)[:40].hex()])
    elif kind == "soundfile":
        import numpy as np
        import soundfile

        frames = np.arange(RECORDS * FRAMES, dtype=np.int64) * 7 % 30011 - 15000
        soundfile.write(path, frames.astype(np.int16), 8000, format="WAV", subtype="PCM_16")
    else:
        with open(path, "wb") as f:
            f.write(b"".join(record(i) for i in range(RECORDS)))


def read_record(fh, i):
    """Module level: what the ``partial`` kind binds its file to."""
    fh.seek(i * RECORD)
    time.sleep(SLOW_S)
    return fh.read(RECORD)


def make_reader(path):
    fh = open(path, "rb")

    def read(i):
        fh.seek(i * RECORD)
        time.sleep(SLOW_S)
        return fh.read(RECORD)

    return read


POOL = {}  # path -> handle: the module-level pool the weakproxy kind points into


def pooled(path):
    if path not in POOL:
        POOL[path] = open(path, "rb")
    return weakref.proxy(POOL[path])


def sample(data, i):
    digest = hashlib.sha256(data).digest()[:8]
    return torch.tensor(list(digest) + [len(data), i], dtype=torch.float64) + torch.rand(1)


class Records(Dataset):
    def __init__(self, kind, lazy):
        self.kind = kind
        self.path = data_path(kind)
        self.held = None
        if kind == "tempfile":  # the records are written to the temporary file itself
            self.tmp = tempfile.NamedTemporaryFile("w+b", dir=TMP, suffix=".tmp")
            with open(self.path, "rb") as src:
                self.tmp.write(src.read())
            self.tmp.flush()
            self.path = self.tmp.name
        if not lazy:
            self.held = self.tmp if kind == "tempfile" else self.open()

    def open(self):
        kind, path = self.kind, self.path
        if kind == "rawfd":
            return os.open(path, os.O_RDONLY)
        if kind == "rplus":
            return open(path, "r+b")
        if kind == "tempfile":
            return open(path, "rb")
        if kind == "partial":
            return functools.partial(read_record, open(path, "rb"))
        if kind == "closure":
            return make_reader(path)
        if kind == "weakproxy":
            return pooled(path)
        if kind == "soundfile":
            import soundfile

            return soundfile.SoundFile(path)
        raise ValueError(kind)

    def __len__(self):
        return RECORDS

    def read(self, i):
        kind, held = self.kind, self.held
        if kind == "rawfd":
            os.lseek(held, i * RECORD, os.SEEK_SET)
            time.sleep(SLOW_S)
            return os.read(held, RECORD)
        if kind in ("partial", "closure"):
            return held(i)
        if kind == "soundfile":
            held.seek(i * FRAMES)
            time.sleep(SLOW_S)
            return held.read(FRAMES, dtype="int16").tobytes()
        return read_record(held, i)

    def __getitem__(self, i):
        if self.held is None:  # the twin: opened in the process that reads
            self.held = self.open()
        return sample(self.read(i), i)


class Rows(IterableDataset):
    """Every worker reads the whole file from its start and keeps its shard."""

    def __init__(self, lazy):
        self.path = data_path("csv")
        self.reader = None if lazy else csv.reader(open(self.path, newline=""))

    def __iter__(self):
        reader = self.reader or csv.reader(open(self.path, newline=""))
        info = get_worker_info()
        shard, shards = (info.id, info.num_workers) if info is not None else (0, 1)
        for n, row in enumerate(reader):
            if n % shards == shard:
                yield sample(bytes.fromhex(row[1]), int(row[0]))


def make(kind, mode):
    lazy = mode == "twin"
    return Rows(lazy) if kind == "csv" else Records(kind, lazy)


def main(kind, mode, workers, epochs):
    torch.manual_seed(0)
    dataset = make(kind, mode)
    batch = 4
    loader = DataLoader(dataset, batch_size=batch, num_workers=workers)
    h, rows = hashlib.sha256(), 0
    for _ in range(epochs):
        if mode == "emulated":
            from autosafe_torch.remedies.emulated_workers import EmulatedWorkersIter

            batches = EmulatedWorkersIter(loader)
        else:
            batches = loader
        for b in batches:
            h.update(b.numpy().tobytes())
            rows += len(b)
    print("ROWS", rows, flush=True)
    print("BATCHES", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 2,
         int(sys.argv[4]) if len(sys.argv) > 4 else 1)
