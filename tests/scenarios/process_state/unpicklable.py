"""A database connection main() opens into a module global that __getitem__
reads: it does not pickle, and a spawned worker's import leaves it None."""

import os
import sqlite3
import sys

import torch
from torch.utils.data import DataLoader, Dataset

from _loop import sample, train

DB = None


class Rows(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        (value,) = DB.execute("SELECT v FROM t WHERE k = ?", (i,)).fetchone()
        return sample(torch.full((4,), value))


def main():
    global DB
    path = os.path.join(os.environ.get("SCENARIO_TMP", "."), "rows.db")
    if not os.path.exists(path):
        with sqlite3.connect(path) as made:
            made.execute("CREATE TABLE t (k INTEGER, v REAL)")
            made.executemany("INSERT INTO t VALUES (?, ?)", [(k, k * 1.5) for k in range(24)])
    DB = sqlite3.connect("file:%s?mode=ro" % path, uri=True, check_same_thread=False)
    torch.manual_seed(0)
    train(DataLoader(Rows(), batch_size=4, shuffle=True, num_workers=2))


if __name__ == "__main__":
    sys.exit(main())
