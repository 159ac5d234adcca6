"""Datasets whose constructors a spawned worker cannot be sent, as real code writes them.

python constructors.py KIND [lazy] [--features v1|v2]

Each holds, from ``__init__``, what neither pickles nor copies (a pyarrow
``ParquetFile``, an Arrow IPC reader over a memory map, a logging handler),
so spawn workers (macOS, Windows, Linux's forkserver) fail plainly; forked
ones run. KIND (data written to ``SCENARIO_TMP``):

- ``config``: a module-level config that ``main()`` changes (``--features v2``)
  before construction; the constructor opens ``feats-<version>.arrow``. A
  spawned worker imports the script again, where the default (v1) stands.
- ``days``: parquet day files shuffled in ``__init__`` with ``random.shuffle``,
  after the script drew from the global generator; the dataset keeps the
  ``ParquetFile`` objects, not the paths.
- ``audit``: the dataset adds a ``FileHandler`` to ``logging.getLogger("audit")``
  and logs a line per sample; the script logs to ``train.log``
  (``basicConfig``), where the audit lines propagate too.
- ``counted``: the constructor counts itself (a module-level registry, a class
  counter), logs "loading" to the program's ``train.log`` and parses a CSV of
  labels; it keeps a ``ParquetFile``.
- ``ordinary``: arguments as real code passes them: a ``Compose`` of
  transform objects, a cleaned pandas DataFrame of labels, numpy integers.
- ``peeked``: ``__getitem__`` fills a one-entry cache, and the script peeks
  at ``dataset[0]`` before the loader.
- ``runtime``: ``audit``, whose ``__getitem__`` also reads a class attribute and
  a module-level value that ``main()`` set.
- ``weighted``: ``days``, whose constructor reads a weight from the config
  ``main()`` set.

``lazy``: the hand fix, each handle made in the process that uses it.

Each sample: the row's value, the label, the worker id and per-worker seeded
draws (torch, random, numpy). Prints ``BATCHES <sha256>`` (two epochs),
``PIDS <worker processes>`` and the program's effects: ``REGISTRY``,
``MADE``, ``LOADING`` (the constructor's lines in train.log), ``AUDIT``
(lines in audit.log), ``TRAIN_AUDIT`` (audit lines in train.log),
``SHIM_IN_LOG`` (lines of autosafe_torch's in train.log).
"""

import argparse
import hashlib
import logging
import os
import random
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

TMP = os.environ.get("SCENARIO_TMP", ".")
DAYS, ROWS = 4, 6
# main() may change these: a spawned worker sees the values here
CONFIG = {"features": "v1", "scale": 1.0}
REGISTRY = []                 # every dataset made, by the program
log = logging.getLogger("constructors")
LOG_FORMAT = "%(name)s %(message)s"
# SCENARIO_LOG_AT_IMPORT=1: logging configured at module level, unguarded, so that a
# spawned worker's own import configures it too.
LOG_AT_IMPORT = bool(os.environ.get("SCENARIO_LOG_AT_IMPORT"))
if LOG_AT_IMPORT:
    logging.basicConfig(filename=os.path.join(TMP, "train.log"), level=logging.INFO,
                        format=LOG_FORMAT)


def sample(value, label, i):
    info = get_worker_info()
    noise = [torch.rand(1).item(), random.random(), float(np.random.rand())]
    return torch.tensor([float(value), float(label), float(i),
                         float(info.id if info else -1)] + noise), os.getpid()


def write_data():
    import pyarrow as pa
    import pyarrow.parquet as pq

    for version, offset in (("v1", 0.0), ("v2", 1000.0)):
        table = pa.table({"x": [offset + k for k in range(DAYS * ROWS)]})
        with pa.OSFile(os.path.join(TMP, "feats-%s.arrow" % version), "wb") as sink, \
                pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    for day in range(DAYS):
        pq.write_table(pa.table({"x": [100.0 * day + k for k in range(ROWS)]}),
                       os.path.join(TMP, "day%d.parquet" % day))
    with open(os.path.join(TMP, "labels.csv"), "w") as f:
        f.write("row,label\n" + "".join("%d,%d\n" % (k, k % 3) for k in range(DAYS * ROWS)))


class Days(Dataset):
    """Rows of parquet day files, in an order drawn at construction."""

    def __init__(self, root, lazy=False):
        import pyarrow.parquet as pq

        paths = sorted(os.path.join(root, "day%d.parquet" % d) for d in range(DAYS))
        random.shuffle(paths)
        self.paths, self.lazy = paths, lazy
        self.files = None if lazy else [pq.ParquetFile(p) for p in paths]

    def day(self, d):
        if self.files is None:
            import pyarrow.parquet as pq

            self.files = [pq.ParquetFile(p) for p in self.paths]
        return self.files[d]

    def __len__(self):
        return DAYS * ROWS

    def __getitem__(self, i):
        value = self.day(i // ROWS).read().column(0)[i % ROWS].as_py()
        return sample(value, i % 3, i)


class Paced(Days):
    """Days, each file a moment after the last, as a slow constructor opens
    them: the second is built while the shim's thread starts a fork server for
    the first loader, opening and closing descriptors meanwhile."""

    def __init__(self, root, lazy=False):
        import pyarrow.parquet as pq

        super().__init__(root, lazy=True)  # the days' order drawn, no file open yet
        self.lazy, self.files = lazy, []
        for path in self.paths:
            self.files.append(pq.ParquetFile(path))
            time.sleep(0.02)


class Features(Dataset):
    def __init__(self, root, lazy=False):
        self.path = os.path.join(root, "feats-%s.arrow" % CONFIG["features"])
        self.reader = None if lazy else self.open()

    def open(self):
        import pyarrow as pa

        return pa.ipc.open_file(pa.memory_map(self.path))

    def __len__(self):
        return DAYS * ROWS

    def __getitem__(self, i):
        if self.reader is None:
            self.reader = self.open()
        return sample(self.reader.get_batch(0).column(0)[i].as_py(), i % 3, i)


class Audited(Days):
    def __init__(self, root, lazy=False):
        super().__init__(root, lazy=True)  # the files are not the point here
        self.audit = logging.getLogger("audit")
        self.audit.setLevel(logging.INFO)
        self.handler = None
        if not lazy:
            self.handler = logging.FileHandler(os.path.join(root, "audit.log"))
            self.audit.addHandler(self.handler)

    def __getitem__(self, i):
        if self.handler is None:  # the hand fix: the handler made in each process
            self.handler = logging.FileHandler(os.path.join(TMP, "audit.log"))
            self.audit.addHandler(self.handler)
        self.audit.info("sample %d", i)
        return super().__getitem__(i)


class Runtime(Audited):
    """Reads, in __getitem__, a class attribute and a module-level value that
    main() sets: a spawned worker imports the script again and reads defaults."""

    factor = 1.0

    def __getitem__(self, i):
        x, pid = super().__getitem__(i)
        x[0] = x[0] * type(self).factor * CONFIG["scale"]
        return x, pid


class Weighted(Days):
    """Days whose constructor reads a weight from the config main() set."""

    def __init__(self, root, lazy=False):
        super().__init__(root, lazy)
        self.weight = CONFIG["scale"]

    def __getitem__(self, i):
        x, pid = super().__getitem__(i)
        x[0] = x[0] * self.weight
        return x, pid


class Counted(Days):
    made = 0

    def __init__(self, root, lazy=False):
        import pandas as pd

        type(self).made += 1
        REGISTRY.append(type(self).__name__)
        log.info("loading %s", os.path.basename(root))
        self.labels = pd.read_csv(os.path.join(root, "labels.csv"))["label"].to_numpy()
        super().__init__(root, lazy)

    def __getitem__(self, i):
        x, pid = super().__getitem__(i)
        x[1] = float(self.labels[i])
        return x, pid


class Scale:
    def __init__(self, factor):
        self.factor = factor

    def __call__(self, x):
        return x * self.factor


class Shift:
    def __init__(self, by):
        self.by = by

    def __call__(self, x):
        return x + self.by


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class Ordinary(Days):
    def __init__(self, root, transform, labels, classes, low, lazy=False):
        super().__init__(root, lazy)
        self.transform, self.labels = transform, labels
        self.classes, self.low = classes, low

    def __getitem__(self, i):
        x, pid = super().__getitem__(i)
        x[0] = self.transform(x[0])
        x[1] = float(self.labels["label"].iloc[i] % self.classes + self.low)
        return x, pid


class Peeked(Days):
    def __init__(self, root, lazy=False):
        super().__init__(root, lazy)
        self.cache = {}

    def __getitem__(self, i):
        if i not in self.cache:
            self.cache.clear()  # one entry: the last sample read
            self.cache[i] = super().__getitem__(i)[0]
        return self.cache[i].clone(), os.getpid()


def make(kind, lazy):
    if kind == "ordinary":
        import pandas as pd

        frame = pd.read_csv(os.path.join(TMP, "labels.csv")).dropna()
        frame = frame[frame["label"] >= 0].reset_index(drop=True)
        classes = frame["label"].max() + 1             # a numpy integer
        low = np.percentile(frame["label"], 10).astype(int)
        return Ordinary(TMP, Compose([Scale(2.0), Shift(1.0)]), frame, classes, low, lazy=lazy)
    if kind == "runtime":
        Runtime.factor, CONFIG["scale"] = 3.0, 2.0  # from the command line, say
    if kind == "weighted":
        CONFIG["scale"] = 5.0
    return {"config": Features, "days": Days, "paced": Paced, "audit": Audited,
            "counted": Counted,
            "peeked": Peeked, "runtime": Runtime, "weighted": Weighted}[kind](TMP, lazy=lazy)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("kind")
    parser.add_argument("mode", nargs="?", default="")
    parser.add_argument("--features", default="v2")
    parser.add_argument("--loaders", type=int, default=1)  # each its own dataset, one site
    args = parser.parse_args()
    write_data()
    for name in ("train.log", "audit.log")[LOG_AT_IMPORT:]:  # this run's lines only
        if os.path.exists(os.path.join(TMP, name)):
            os.remove(os.path.join(TMP, name))
    CONFIG["features"] = args.features
    if not LOG_AT_IMPORT:
        logging.basicConfig(filename=os.path.join(TMP, "train.log"), level=logging.INFO,
                            format=LOG_FORMAT)
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    random.random()  # the script drew before constructing
    loaders = []
    for _ in range(args.loaders):
        dataset = make(args.kind, args.mode == "lazy")
        if args.kind == "peeked":
            dataset[0]  # a look before training: the cache holds it
        loaders.append(DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2))
    model = torch.nn.Linear(7, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    h, pids = hashlib.sha256(), set()
    for _epoch in range(2):
        for loader in loaders:
            for x, pid in loader:
                h.update(x.numpy().tobytes())
                pids.update(pid.tolist())
                optimizer.zero_grad()
                model(x).square().mean().backward()
                optimizer.step()
    print("BATCHES", h.hexdigest(), flush=True)
    print("PIDS", len(pids - {os.getpid()}), flush=True)
    print("REGISTRY", len(REGISTRY), "MADE", Counted.made, flush=True)
    logging.shutdown()
    lines = {}
    for name in ("train.log", "audit.log"):
        path = os.path.join(TMP, name)
        lines[name] = open(path).read().splitlines() if os.path.exists(path) else []
    print("LOADING", sum(1 for line in lines["train.log"] if " loading " in line), flush=True)
    print("AUDIT", len(lines["audit.log"]), flush=True)
    print("TRAIN_AUDIT", sum(1 for line in lines["train.log"] if line.startswith("audit ")))
    print("SHIM_IN_LOG", sum(1 for line in lines["train.log"] if "autosafe_torch" in line
                             or " DL2" in line), flush=True)


if __name__ == "__main__":
    sys.exit(main())
