"""Datasets that hold a file opened in ``__init__``, each through another wrapper.

argv: KIND MODE [WORKERS [EPOCHS]].

KIND: zip, tar, gzip, bz2, lzma, npz, text-crlf, delegator, iterable (the
wrappers issue 19 lists: each holds one read-only file descriptor, most of
them inside a library object that cannot be reopened by path with its state).
MODE: ``held`` opens the file in ``__init__`` (the legacy code); ``twin`` is
the safe twin, the same dataset opening its file on first use in each
process, which every start method runs as it is.

Every sample reads its own record at its own place and adds a random draw
(torch's global generator, seeded per worker), so a shared file offset shows
as other bytes or a broken stream, and a wrong worker seed as other draws.
Prints ``BATCHES <sha256>``; the data files go to SCENARIO_TMP.
"""

import bz2
import gzip
import hashlib
import io
import lzma
import os
import sys
import tarfile
import time
import zipfile

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

TMP = os.environ.get("SCENARIO_TMP", ".")
RECORDS = 48
# More than a read buffer (8 KiB) per record: every read reaches the OS, and
# with it the offset forked workers would share.
RECORD = 9000
SLOW_S = 0.002  # the work between seeking and reading (decoding, say)


def record(i):
    return bytes((i * 7 + j) % 251 for j in range(RECORD))


def data_path(kind):
    suffix = {"zip": ".zip", "tar": ".tar", "gzip": ".gz", "bz2": ".bz2", "lzma": ".xz",
              "npz": ".npz", "text-crlf": ".txt"}.get(kind, ".bin")
    path = os.path.join(TMP, "records" + suffix)
    if not os.path.exists(path):
        _write(kind, path + ".part")
        os.replace(path + ".part", path)
    return path


def _write(kind, path):
    body = b"".join(record(i) for i in range(RECORDS))
    if kind == "zip":
        with zipfile.ZipFile(path, "w") as z:
            for i in range(RECORDS):
                z.writestr("r%d" % i, record(i))
    elif kind == "tar":
        with tarfile.open(path, "w") as t:
            for i in range(RECORDS):
                info = tarfile.TarInfo("r%d" % i)
                info.size = RECORD
                t.addfile(info, io.BytesIO(record(i)))
    elif kind in ("gzip", "bz2", "lzma"):
        with {"gzip": gzip, "bz2": bz2, "lzma": lzma}[kind].open(path, "wb") as f:
            f.write(body)
    elif kind == "npz":
        with open(path, "wb") as f:
            np.savez(f, **{"r%d" % i: np.frombuffer(record(i), np.uint8) for i in range(RECORDS)})
    elif kind == "text-crlf":
        with open(path, "w", newline="") as f:
            for i in range(RECORDS):
                f.write(record(i).hex()[:RECORD] + "\r\n")
    else:
        with open(path, "wb") as f:
            f.write(body)


def text_offsets(path):
    offsets, at = [], 0
    with open(path, "rb") as f:
        for line in f:
            offsets.append(at)
            at += len(line)
    return offsets


class Delegator:
    """A user's wrapper: everything it does not define, it asks its file."""

    def __init__(self, f):
        self._f = f

    def __getattr__(self, name):
        return getattr(self._f, name)


def open_held(kind, path):
    """What the legacy dataset keeps on ``self`` (opened once, in ``__init__``)."""
    if kind == "zip":
        return zipfile.ZipFile(path)
    if kind == "tar":
        return tarfile.open(path)
    if kind == "gzip":
        return gzip.open(path, "rb")
    if kind == "bz2":
        return bz2.open(path, "rb")
    if kind == "lzma":
        return lzma.open(path, "rb")
    if kind == "npz":
        return np.load(path)
    if kind == "text-crlf":
        return open(path, newline="")
    if kind == "delegator":
        return Delegator(open(path, "rb"))
    return open(path, "rb")


def read(kind, held, i, offsets=None):
    """Record ``i`` through ``held``."""
    if kind == "zip":
        with held.open("r%d" % i) as member:
            time.sleep(SLOW_S)
            return member.read()
    if kind == "tar":
        member = held.extractfile("r%d" % i)
        time.sleep(SLOW_S)
        return member.read()
    if kind == "npz":
        time.sleep(SLOW_S)
        return held["r%d" % i].tobytes()
    if kind == "text-crlf":
        held.seek(offsets[i])
        time.sleep(SLOW_S)
        return held.readline().encode()  # its "\r\n" (or a lost "\r") shows
    held.seek(i * RECORD)
    time.sleep(SLOW_S)
    return held.read(RECORD)


def sample(data, i):
    digest = hashlib.sha256(data).digest()[:8]
    return torch.tensor(list(digest) + [len(data), i], dtype=torch.float64) + torch.rand(1)


class Records(Dataset):
    def __init__(self, kind, lazy):
        self.kind = kind
        self.path = data_path(kind)
        self.offsets = text_offsets(self.path) if kind == "text-crlf" else None
        self.held = None if lazy else open_held(kind, self.path)

    def __len__(self):
        return RECORDS

    def __getitem__(self, i):
        if self.held is None:  # the twin: opened in the process that reads
            self.held = open_held(self.kind, self.path)
        return sample(read(self.kind, self.held, i, self.offsets), i)


class RecordStream(IterableDataset):
    """Reads the file from its start in every worker and keeps its shard."""

    def __init__(self, lazy):
        self.path = data_path("iterable")
        self.f = None if lazy else open(self.path, "rb")

    def __iter__(self):
        if self.f is None:
            self.f = open(self.path, "rb")
        info = get_worker_info()
        shard, shards = (info.id, info.num_workers) if info is not None else (0, 1)
        self.f.seek(0)
        for i in range(RECORDS):
            time.sleep(SLOW_S)
            data = self.f.read(RECORD)
            if i % shards == shard:
                yield sample(data, i)


def make(kind, mode):
    lazy = mode == "twin"
    return RecordStream(lazy) if kind == "iterable" else Records(kind, lazy)


def main(kind, mode, workers, epochs):
    torch.manual_seed(0)
    loader = DataLoader(make(kind, mode), batch_size=4, num_workers=workers)
    h = hashlib.sha256()
    for _ in range(epochs):
        for batch in loader:
            h.update(batch.numpy().tobytes())
    print("BATCHES", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 2,
         int(sys.argv[4]) if len(sys.argv) > 4 else 1)
