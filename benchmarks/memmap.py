"""Figure 15: memory maps under spawn, against the hand fix: a numpy memmap
(DL218) and an ``mmap.mmap`` (DL201).

A 300 MiB float32 file, rows of 3x64x64; 2 spawn workers, 3 epochs, a
small model and its optimizer built after the DataLoader, forward/backward/
step per batch (the legacy loop). Variants, each in a fresh process,
alternating:

- ``shim``: a dataset holding ``np.memmap(path, mode='r')`` under
  autosafe_torch (DL218: mapped again in each worker);
- ``hand``: the hand fix, a dataset that keeps the path and maps the file
  lazily in ``__getitem__`` (in each worker);
- ``plain``: the memmap dataset without the shim (pickled whole into every
  worker start);
- ``mmap-shim``: a dataset holding ``mmap.mmap(..., access=ACCESS_READ)``
  under autosafe_torch (DL201: mapped again in each worker; without the
  shim it does not start at all: a map does not pickle);
- ``mmap-hand``: its hand fix, the map made lazily in each worker.

Measured: the wall time of the loop (DataLoader to the last step), and peak
memory: the parent's peak RSS (VmHWM) plus, per epoch, the sum of the peak
RSS of every process below it (workers, and a warm server and the workers
it forks), the largest epoch. File pages a process touched count in its
RSS in every variant. Each run also sums every batch: all must agree (the
same data).

    python benchmarks/memmap.py [--mib 300] [--reps 2]
"""

import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import QUICK, RESULTS_DIR, Row, child_env, json_child, median  # noqa: E402

SHAPE = (3, 64, 64)
VARIANTS = ("shim", "hand", "plain", "mmap-shim", "mmap-hand")


# ------------------------------------------------------------------ the child

def _hwm(pid):
    """Peak RSS (bytes) of ``pid``, or None once it is gone."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class Peaks(threading.Thread):
    """Every 20 ms: each child process's peak RSS, by the epoch it was first seen in."""

    def __init__(self):
        super().__init__(daemon=True)
        self.epoch, self.seen, self.stop = 0, {}, False

    def run(self):
        me = os.getpid()
        while not self.stop:
            for pid in _descendants(me):
                hwm = _hwm(pid)
                if hwm is not None:
                    epoch, old = self.seen.get(pid, (self.epoch, 0))
                    self.seen[pid] = (epoch, max(old, hwm))
            time.sleep(0.02)

    def workers_peak(self):
        per_epoch = {}
        for epoch, hwm in self.seen.values():
            per_epoch[epoch] = per_epoch.get(epoch, 0) + hwm
        return max(per_epoch.values()) if per_epoch else 0


def _descendants(pid):
    """Every process below ``pid`` but the resource tracker: the workers, and a
    warm server with the workers it forks."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            with open("/proc/%d/task/%d/children" % (parent, parent)) as f:
                pids = [int(p) for p in f.read().split()]
        except OSError:
            continue
        for child in pids:
            try:
                with open("/proc/%d/cmdline" % child, "rb") as f:
                    if b"resource_tracker" in f.read():
                        continue
            except OSError:
                continue
            found.append(child)
            todo.append(child)
    return found


class Mapped:
    """The legacy dataset: the map made in __init__."""

    def __init__(self, path, rows):
        import numpy as np

        self.rows = rows
        self.images = np.memmap(path, np.float32, "r", shape=(rows,) + SHAPE)

    def __len__(self):
        return self.rows

    def __getitem__(self, i):
        import numpy as np
        import torch

        return torch.from_numpy(np.array(self.images[i])), i % 10


class Lazy(Mapped):
    """The hand fix: the path, mapped in each worker."""

    def __init__(self, path, rows):
        self.path, self.rows, self.images = path, rows, None

    def __getitem__(self, i):
        if self.images is None:
            import numpy as np

            self.images = np.memmap(self.path, np.float32, "r", shape=(self.rows,) + SHAPE)
        return Mapped.__getitem__(self, i)


class RawMapped(Mapped):
    """A legacy dataset over an ``mmap.mmap`` made in __init__."""

    def __init__(self, path, rows):
        import mmap

        self.rows = rows
        with open(path, "rb") as f:
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def __getitem__(self, i):
        import numpy as np
        import torch

        count = int(np.prod(SHAPE))
        row = np.frombuffer(self.map, np.float32, count=count, offset=4 * count * i)
        return torch.from_numpy(row.reshape(SHAPE).copy()), i % 10


class RawLazy(RawMapped):
    """Its hand fix: the path, mapped in each worker."""

    def __init__(self, path, rows):
        self.path, self.rows, self.map = path, rows, None

    def __getitem__(self, i):
        if self.map is None:
            RawMapped.__init__(self, self.path, self.rows)
        return RawMapped.__getitem__(self, i)


DATASETS = {"shim": Mapped, "hand": Lazy, "plain": Mapped, "mmap-shim": RawMapped,
            "mmap-hand": RawLazy}


def child(variant, path, rows, epochs):
    import numpy as np
    import torch
    from torch.utils.data import DataLoader

    peaks = Peaks()
    peaks.start()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    loader = DataLoader(DATASETS[variant](path, rows), batch_size=64, shuffle=True,
                        num_workers=2, multiprocessing_context="spawn")
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(SHAPE)), 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    check = 0.0
    for epoch in range(epochs):
        peaks.epoch = epoch
        for x, y in loader:
            check += float(x.double().sum())
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    wall = time.perf_counter() - t0
    peaks.stop = True
    peaks.join()
    parent = _hwm(os.getpid())
    print(json.dumps({"wall_s": wall, "parent": parent, "workers": peaks.workers_peak(),
                      "memory": parent + peaks.workers_peak(), "check": check}))


# ------------------------------------------------------------------ the runs

def data_file(mib):
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / ("memmap-%d.bin" % mib)
    row = 4 * int(SHAPE[0] * SHAPE[1] * SHAPE[2])
    rows = mib * (1 << 20) // row
    if not path.exists() or path.stat().st_size != rows * row:
        import numpy as np

        gen = np.random.default_rng(0)
        with open(path, "wb") as f:
            for start in range(0, rows, 256):
                n = min(256, rows - start)
                gen.standard_normal((n,) + SHAPE, dtype=np.float32).tofile(f)
    return path, rows


def measure(mib=300, reps=2, epochs=3):
    path, rows = data_file(mib)
    shim, plain = {"AUTOSAFE_TORCH": "1", "AUTOSAFE_TORCH_QUIET": "1"}, {"AUTOSAFE_TORCH": "0"}
    envs = {v: shim if v.endswith("shim") else plain for v in VARIANTS}
    runs = {v: [] for v in VARIANTS}
    for r in range(reps):
        turn = r % len(VARIANTS)
        order = VARIANTS[turn:] + VARIANTS[:turn]
        for variant in order:
            runs[variant].append(json_child(
                [__file__, "child", variant, str(path), str(rows), str(epochs)],
                child_env(envs[variant]), timeout=600))
    return runs


def figures():
    runs = measure(mib=50 if QUICK else 300, reps=1 if QUICK else 3, epochs=2 if QUICK else 3)
    same = len({round(r["check"], 3) for v in runs.values() for r in v}) == 1

    def ratios(key, shim="shim", hand="hand"):
        return [a[key] / b[key] for a, b in zip(runs[shim], runs[hand])]

    note = "; ".join("%s %.1f s, %.2f GiB" % (v, median([r["wall_s"] for r in runs[v]]),
                                              median([r["memory"] for r in runs[v]]) / 2**30)
                     for v in VARIANTS)
    note += " (median; plain: pickled whole into each worker start); the same data in every " \
        "run: %s" % ("yes" if same else "NO")
    return [
        Row(15, "15a 300 MiB np.memmap, 2 spawn workers, 3 epochs: time, shim / hand fix", 1.1,
            "le", "x", ratios("wall_s"), note),
        Row(15, "15b the same: peak memory (parent + workers' peak RSS), shim / hand fix", 1.1,
            "le", "x", ratios("memory"), "hand fix: the dataset maps the file in each worker"),
        Row(15, "15c the same file as an mmap.mmap (ACCESS_READ) held by the dataset: time, "
            "shim / hand fix", 1.1, "le", "x", ratios("wall_s", "mmap-shim", "mmap-hand"),
            "without the shim the loader does not start (a map does not pickle); DL201 maps "
            "it again in each worker"),
        Row(15, "15d the same: peak memory, shim / hand fix", 1.1, "le", "x",
            ratios("memory", "mmap-shim", "mmap-hand"),
            "hand fix: the dataset makes its map in each worker"),
    ]


def main(argv):
    if argv[:1] == ["child"]:
        variant, path, rows, epochs = argv[1], argv[2], int(argv[3]), int(argv[4])
        return child(variant, path, rows, epochs)
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=300)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args(argv)
    runs = measure(a.mib, a.reps, a.epochs)
    for v in VARIANTS:
        for r in runs[v]:
            print("%-5s wall %6.2f s  memory %5.2f GiB (parent %4.2f, workers %4.2f)  check %.3f"
                  % (v, r["wall_s"], r["memory"] / 2**30, r["parent"] / 2**30,
                     r["workers"] / 2**30, r["check"]))
    for key, name in (("wall_s", "time"), ("memory", "peak memory")):
        m = {v: median([r[key] for r in runs[v]]) for v in VARIANTS}
        print("%s: shim / hand %.2fx (goal <= 1.1x); plain / hand %.2fx; mmap: shim / hand "
              "%.2fx (goal <= 1.1x)" % (name, m["shim"] / m["hand"], m["plain"] / m["hand"],
                                        m["mmap-shim"] / m["mmap-hand"]))


if __name__ == "__main__":
    main(sys.argv[1:])
