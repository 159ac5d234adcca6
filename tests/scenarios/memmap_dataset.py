"""A dataset holding numpy memmaps (DL218), run as it is.

``python memmap_dataset.py KIND [changed]``, data in ``SCENARIO_TMP``:

- ``whole``: an ``np.memmap`` of the file (mode 'r', a byte offset that is
  no multiple of a page), one row per sample;
- ``view``: a contiguous slice of an 'r+' memmap (by reference) and a
  strided view of it (pickled: its layout is another when pickled);
- ``cow``: a mode='c' memmap the parent changed (its changes are in no
  file: pickled, and the workers see them).

Each worker prints ``WORKER <attribute> mapped=<bool>`` once: whether its
array's memory is a map of the file (by reference) or a copy (pickled).
With ``changed``, the parent changes the file's modification time right
after the workers were started, before they unpickle what they were sent:
a worker sent a reference must refuse to map it. ``BATCHES`` as ever.
"""

import hashlib
import mmap
import os
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

ROWS, COLS, OFFSET = 96, 40, 12


class Rows(Dataset):
    def __init__(self, kind, path):
        if kind == "whole":
            self.images = np.memmap(path, np.float32, "r", offset=OFFSET, shape=(ROWS, COLS))
        elif kind == "view":
            whole = np.memmap(path, np.float32, "r+", offset=OFFSET, shape=(ROWS, COLS))
            self.images = whole[8:8 + ROWS // 2]
            self.strided = whole[:, ::2]
        else:
            self.images = np.memmap(path, np.float32, "c", offset=OFFSET, shape=(ROWS, COLS))
            self.images[::3] = -1.0  # private to this process: in no file
        self.told = False

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        if not self.told and get_worker_info() is not None:
            self.told = True
            for name in ("images", "strided"):
                arr = getattr(self, name, None)
                if arr is not None:
                    print("WORKER %s mapped=%s type=%s" % (
                        name, isinstance(arr.base, mmap.mmap), type(arr).__name__),
                        flush=True)
        row = torch.from_numpy(np.array(self.images[i]))
        extra = getattr(self, "strided", None)
        if extra is not None:
            row = torch.cat([row, torch.from_numpy(np.array(extra[i]))])
        return row


def main():
    kind = sys.argv[1]
    changed = "changed" in sys.argv[2:]
    path = os.path.join(os.environ.get("SCENARIO_TMP", "."), "rows.bin")
    values = np.arange(ROWS * COLS + OFFSET, dtype=np.float32) * 0.5
    values.tofile(path)
    torch.manual_seed(0)
    loader = DataLoader(Rows(kind, path), batch_size=8, shuffle=True, num_workers=2)
    h = hashlib.sha256()
    for _epoch in range(1 if changed else 2):
        it = iter(loader)
        if changed:  # the workers are started: they unpickle once they have imported torch
            st = os.stat(path)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        for batch in it:
            h.update(batch.numpy().tobytes())
    print("BATCHES", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
