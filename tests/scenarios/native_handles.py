"""Datasets holding an lmdb environment or a cv2.VideoCapture opened in __init__.

argv: KIND (lmdb, video), the number of workers, and options: "rw" (lmdb
opened read-write, though only read), "lock" (the
dataset holds a threading.Lock too: it travels to spawned workers as a new one),
"stream" (the dataset holds a generator too: nothing pickles, so on a Mac only
emulated workers remain), "bounded" (DataLoader(timeout=6): for fork runs,
whose workers start at once). Neither handle pickles under spawn. Under fork,
LMDB forbids the parent's environment in a child (each worker prints
OWN_ENV: whether it uses an environment of its own), and the capture, which
decoded a frame in the parent, hangs its forked workers (bounded here by
the DataLoader's timeout).
"""

import hashlib
import os
import sys
import threading

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

TMP = os.environ.get("SCENARIO_TMP", ".")
N = 12


class Records(Dataset):
    """Read-only lmdb, as LSUN and many image datasets open it."""

    def __init__(self):
        import lmdb

        path = os.path.join(TMP, "records.lmdb")
        if not os.path.exists(path):
            with lmdb.open(path, map_size=1 << 22) as env, env.begin(write=True) as txn:
                for i in range(N):
                    txn.put(b"%d" % i, bytes(range(i, i + 8)))
        # "rw": opened read-write, py-lmdb's default, as much legacy code does.
        self.env = lmdb.open(path, readonly="rw" not in sys.argv, lock=False)

    def __len__(self):
        return N

    def __getitem__(self, i):
        with self.env.begin() as txn:
            return torch.tensor(list(txn.get(b"%d" % i)))


class Frames(Dataset):
    """A video read frame by frame; the first frame read in __init__ (its shape)."""

    def __init__(self):
        import cv2
        import numpy as np

        path = os.path.join(TMP, "clip.avi")
        if not os.path.exists(path):
            out = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"MJPG"), 10, (32, 24))
            for i in range(N):
                out.write(np.full((24, 32, 3), i * 20, np.uint8))
            out.release()
        self.cap = cv2.VideoCapture(path)
        self.shape = self.cap.read()[1].shape

    def __len__(self):
        return N

    def __getitem__(self, i):
        import cv2

        self.cap.set(cv2.CAP_PROP_POS_FRAMES, i)
        ok, frame = self.cap.read()
        return torch.from_numpy(frame[::8, ::8].copy())


PARENT_HANDLE = []  # filled in the parent: a forked worker inherits it, a spawned one not


def report_env(worker_id):
    if PARENT_HANDLE:
        # One write: the workers' lines must not interleave.
        sys.stdout.write("OWN_ENV %s\n" % (get_worker_info().dataset.env is not PARENT_HANDLE[0]))
        sys.stdout.flush()


if __name__ == "__main__":
    kind, workers = sys.argv[1], int(sys.argv[2])
    ds = Records() if kind == "lmdb" else Frames()
    if "lock" in sys.argv:
        ds.lock = threading.Lock()
    if "stream" in sys.argv:
        ds.stream = (i for i in range(3))
    init = None
    if kind == "lmdb" and workers:
        PARENT_HANDLE.append(ds.env)
        init = report_env
    loader = DataLoader(ds, batch_size=4, num_workers=workers, worker_init_fn=init,
                        timeout=6 if "bounded" in sys.argv else 0)
    h = hashlib.sha256()
    for batch in loader:
        h.update(batch.numpy().tobytes())
    print("BATCHES", h.hexdigest(), flush=True)
