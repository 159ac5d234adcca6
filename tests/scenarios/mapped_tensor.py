"""A dataset holding tensors mapped from a file (DL218), run as it is.

``python mapped_tensor.py KIND [changed]``, data in ``SCENARIO_TMP``:

- ``load``: ``torch.load(path, mmap=True)`` of a saved dict: ``dataset.tokens``
  (8 MiB of float32), ``dataset.weight`` (a Parameter over another tensor of
  the file) and ``dataset.cols`` (a transposed view of that same storage);
- ``memory``: the same tensors made in memory (no file): nothing to map;
- ``written``: as ``load``, then the training process writes into
  ``tokens``: its private map holds a change that is in no file (pickled as
  before, and the workers see the change);
- ``from_file``: ``tokens`` over ``torch.UntypedStorage.from_file`` of a raw
  file (torch cannot send that storage to a spawn worker at all).

Each worker prints ``WORKER <attribute> mapped=<bool> shared=<bool>
real=<bool>`` once per tensor: whether its storage lies in a map of the file
(``/proc/self/maps``), whether torch calls it shared memory, and whether the
worker is a process of its own. The training process prints ``PARENT
shared=<bool> shm_rise=<bytes>``: whether ``tokens`` was moved into shared
memory, and how much more of ``/dev/shm`` it maps at the loader's first
batch than before the dataset was made. With ``changed``, the file's
modification time changes right after the workers of the first epoch were
started, before they unpickle what they were sent: a worker sent a reference
must refuse to map it. ``BATCHES`` as ever.
"""

import hashlib
import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

SAMPLES, PER_SAMPLE = 96, 1 << 14  # tokens: 96 * 16384 float32 = 6 MiB
ROWS, COLS = 48, 20


def shm_used():
    """Bytes of ``/dev/shm`` this process maps (torch's shared memory; the
    whole of ``/dev/shm`` would count what other programs hold too)."""
    used = 0
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                used += end - start
    return used


def mapped_from(tensor, path):
    """Whether ``tensor``'s storage lies in a mapping of ``path`` here."""
    address = tensor.untyped_storage().data_ptr()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return len(fields) == 6 and fields[5].strip() == os.path.realpath(path)
    return False


class Mapped(Dataset):
    def __init__(self, kind, path):
        self.path, self.parent = path, os.getpid()
        tokens = torch.arange(SAMPLES * PER_SAMPLE, dtype=torch.float32) * 0.25
        table = torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS) - 7
        if kind == "from_file":
            tokens.numpy().tofile(path)
            storage = torch.UntypedStorage.from_file(path, shared=False,
                                                     nbytes=tokens.numel() * 4)
            self.tokens = torch.empty(0).set_(storage)
            self.weight = torch.nn.Parameter(table, requires_grad=False)
            self.cols = table.t()
        else:
            if kind != "memory":
                torch.save({"tokens": tokens, "table": table}, path)
                loaded = torch.load(path, mmap=True)
                tokens, table = loaded["tokens"], loaded["table"]
            self.tokens = tokens
            self.weight = torch.nn.Parameter(table, requires_grad=False)
            self.cols = table.t()  # a view of the weight's storage
            if kind == "written":
                self.tokens[::4096] = -1.0  # private to this process: in no file
        self.told = False

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        if not self.told and get_worker_info() is not None:
            self.told = True
            for name in ("tokens", "weight"):
                t = getattr(self, name)
                print("WORKER %s mapped=%s shared=%s real=%s" % (
                    name, mapped_from(t, self.path), t.is_shared(),
                    os.getpid() != self.parent), flush=True)
        part = self.tokens[i * PER_SAMPLE:(i + 1) * PER_SAMPLE]  # the whole file is read
        return torch.cat([part[:8], part.sum().reshape(1), self.weight[i % ROWS],
                          self.cols[:, i % COLS]])


def main():
    kind = sys.argv[1]
    changed = "changed" in sys.argv[2:]
    path = os.path.join(os.environ.get("SCENARIO_TMP", "."),
                        "tokens.bin" if kind == "from_file" else "tokens.pt")
    before = shm_used()
    dataset = Mapped(kind, path)
    torch.manual_seed(0)
    loader = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=2)
    h, rise = hashlib.sha256(), None
    for epoch in range(2):
        it = iter(loader)
        if changed and epoch == 0:  # started: they unpickle once they have imported torch
            st = os.stat(path)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        for batch in it:
            if rise is None:
                rise = shm_used() - before
            h.update(batch.numpy().tobytes())
    print("PARENT shared=%s shm_rise=%d" % (dataset.tokens.is_shared(), rise), flush=True)
    print("BATCHES", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
