"""Datasets holding a read-only sqlite connection, or a text file, opened in __init__.

argv: KIND (sqlite, text-lf, text-crlf, text-crlf-read: the parent read a
line after construction) and the number of workers. Under
spawn none pickles. The sqlite connection and the LF text file can be
reopened by path in each worker; a CRLF text file cannot (its newline
argument cannot be read back, and CRLF read as LF would change the samples
silently), so it takes another rung: where there is no fork, the dataset
built again in each worker, unless it was read after construction.
"""

import hashlib
import os
import sqlite3
import sys

import torch
from torch.utils.data import DataLoader, Dataset

TMP = os.environ.get("SCENARIO_TMP", ".")


class Rows(Dataset):
    def __init__(self):
        path = os.path.join(TMP, "rows.db")
        if not os.path.exists(path):
            with sqlite3.connect(path) as db:
                db.execute("create table t (i integer, v real)")
                db.executemany("insert into t values (?, ?)", [(i, i * 1.5) for i in range(16)])
        self.db = sqlite3.connect(path, check_same_thread=False)

    def __len__(self):
        return 16

    def __getitem__(self, i):
        (v,) = self.db.execute("select v from t where i = ?", (i,)).fetchone()
        return torch.tensor([v])


class Lines(Dataset):
    def __init__(self, newline):
        path = os.path.join(TMP, "lines%s.txt" % len(newline))
        if not os.path.exists(path):
            with open(path, "w", newline="") as f:
                f.write("".join("line %d%s" % (i, newline) for i in range(16)))
        self.f = open(path, newline="")
        self.lines = self.f.readlines()
        self.f.seek(0)

    def __len__(self):
        return 16

    def __getitem__(self, i):
        self.f.seek(0)
        for _ in range(i + 1):
            line = self.f.readline()
        return torch.tensor([float(len(line))])  # a CR, read or not, shows in the length


if __name__ == "__main__":
    kind, workers = sys.argv[1], int(sys.argv[2])
    ds = Rows() if kind == "sqlite" else Lines("\r\n" if kind.startswith("text-crlf") else "\n")
    if kind == "text-crlf-read":  # read after construction: no new build is at that place
        ds.f.readline()
    h = hashlib.sha256()
    for batch in DataLoader(ds, batch_size=4, num_workers=workers):
        h.update(batch.numpy().tobytes())
    print("BATCHES", h.hexdigest(), flush=True)
