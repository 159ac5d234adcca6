"""Figures 3, 5 and 6, measured inside one child process.

The child imports torch, takes a snapshot of every attribute a patch could
replace, then ``import autosafe_torch`` (which applies the patches at once,
torch being imported). Blocks of measurements then alternate between the
patched state and the reverted one (``autosafe_torch.deactivate()`` puts the
originals back, ``activate()`` applies the patches again); the snapshot
checks that the reverted state really is torch's own. Each block pair gives
one value: patched − reverted (µs per call) or patched / reverted.

Usage: python inproc.py FIGURE...   (3, 5, 6); prints one JSON line.
"""

import json
import os
import sys
import time
import warnings

QUICK = os.environ.get("BENCH_QUICK", "").strip() not in ("", "0")

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset  # noqa: E402


def _watched():
    import torch.utils.data.dataloader as dl

    owners = {"torch": torch, "torch.amp": torch.amp, "torch.cuda.amp": torch.cuda.amp,
              "torch.utils.data": torch.utils.data, "dataloader": dl}
    for cls_name in ("DataLoader", "_BaseDataLoaderIter", "_SingleProcessDataLoaderIter",
                     "_MultiProcessingDataLoaderIter"):
        owners[cls_name] = getattr(dl, cls_name)
    for name in ("autocast", "GradScaler"):
        for mod in ("torch.amp", "torch.cuda.amp"):
            obj = getattr(sys.modules[mod], name, None)
            if isinstance(obj, type):
                owners["%s.%s" % (mod, name)] = obj
    return owners


def snapshot():
    snap = {}
    for label, owner in _watched().items():
        items = vars(owner).items()
        for name, value in items:
            snap["%s.%s" % (label, name)] = id(value)
    return snap


def diff(a, b):
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


PRISTINE = snapshot()
# keep the originals alive so that their ids stay meaningful
_KEEP = [dict(vars(o)) for o in _watched().values()]

import autosafe_torch  # noqa: E402  (activates; patches torch now)

PATCHED = snapshot()
STATE = {"on": True, "bad_revert": set()}


def set_state(on):
    if on and not STATE["on"]:
        autosafe_torch.activate("worker")   # "worker": no "activated late" line
    elif not on and STATE["on"]:
        autosafe_torch.deactivate()
        bad = diff(PRISTINE, snapshot())
        STATE["bad_revert"].update(bad)
    STATE["on"] = on


def paired_blocks(measure, blocks, mode):
    """``measure()`` -> seconds per unit; alternate on/off; one value per pair."""
    out = []
    for b in range(blocks):
        order = (True, False) if b % 2 == 0 else (False, True)
        got = {}
        for on in order:
            set_state(on)
            got[on] = measure()
        if mode == "diff_us":
            out.append((got[True] - got[False]) * 1e6)
        else:
            out.append(got[True] / got[False])
    set_state(True)
    return out


# ---------------------------------------------------------------- figure 3

class FileListDataset(Dataset):
    """Map-style, as most image datasets are: paths and labels."""

    def __init__(self, n):
        self.paths = ["/data/img_%06d.jpg" % i for i in range(n)]
        self.labels = [i % 10 for i in range(n)]

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return torch.zeros(3, 8, 8), self.labels[i]


class ImageFolderLike(Dataset):
    """torchvision's ImageFolder keeps ``samples``: (path, class) tuples."""

    def __init__(self, n):
        self.classes = ["class_%03d" % c for c in range(100)]
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples = [("/data/train/class_%03d/img_%07d.JPEG" % (i % 100, i), i % 100)
                        for i in range(n)]
        self.targets = [s[1] for s in self.samples]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return torch.zeros(3, 8, 8), self.targets[i]


class CounterStream(IterableDataset):
    def __iter__(self):
        return iter(range(1000))


def fig3():
    workers = min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                  else os.cpu_count() or 1)
    tensors = TensorDataset(torch.zeros(1000, 3, 32, 32), torch.zeros(1000, dtype=torch.long))
    files = FileListDataset(5000)
    folder = ImageFolderLike(10000 if QUICK else 100000)
    stream = CounterStream()
    cases = [
        ("3a TensorDataset, batch 64, shuffle, workers 0",
         lambda: DataLoader(tensors, batch_size=64, shuffle=True)),
        ("3b map-style (paths), batch 32, shuffle, %d workers, persistent" % workers,
         lambda: DataLoader(files, batch_size=32, shuffle=True, num_workers=workers,
                            persistent_workers=True, drop_last=True)),
        ("3c IterableDataset, batch 16, %d workers" % workers,
         lambda: DataLoader(stream, batch_size=16, num_workers=workers)),
        ("3d TensorDataset, batch 64, %d workers, spawn context" % workers,
         lambda: DataLoader(tensors, batch_size=64, shuffle=True, num_workers=workers,
                            multiprocessing_context="spawn")),
        ("3e ImageFolder-like, %d (path, class) samples, batch 256, shuffle, %d workers"
         % (len(folder), workers),
         lambda: DataLoader(folder, batch_size=256, shuffle=True, num_workers=workers)),
    ]
    rows = []
    for name, make in cases:
        for on in (False, True):   # warm up both states
            set_state(on)
            make()
        t0 = time.perf_counter()
        make()                     # patched: the slower one, if any
        one = time.perf_counter() - t0
        # about 30 ms of calls per block; fewer blocks where a call is slow
        calls = max(1, min(400, int(0.03 / max(one, 1e-7))))
        blocks = 4 if QUICK else (16 if one < 0.01 else 6)

        def measure(calls=calls, make=make):
            t0 = time.perf_counter()
            for _ in range(calls):
                make()
            return (time.perf_counter() - t0) / calls
        values = paired_blocks(measure, blocks, "diff_us")
        set_state(False)
        base = measure() * 1e6
        set_state(True)
        rows.append({"name": name, "values": values,
                     "note": "DataLoader(...) alone: %.1f µs; %d calls per block" % (
                         base, calls)})
    return rows


# ---------------------------------------------------------------- figure 5

def fig5():
    n = 2048 if QUICK else 4096
    ds = TensorDataset(torch.arange(n * 8, dtype=torch.float32).view(n, 8),
                       torch.arange(n))
    # 8 epochs (about 130 ms) a block: with 1 (16 ms) the min-max spanned -35 % to +66 %.
    blocks, epochs = (4, 1) if QUICK else (40, 8)
    rows = []

    def measure0():
        loader = DataLoader(ds, batch_size=16, shuffle=False)
        nb = 0
        t0 = time.perf_counter()
        for _ in range(epochs):
            for _batch in loader:
                nb += 1
        return (time.perf_counter() - t0) / nb

    for on in (False, True):
        set_state(on)
        measure0()
    values = paired_blocks(measure0, blocks, "ratio")
    set_state(False)
    base = measure0() * 1e6
    set_state(True)
    rows.append({"name": "5a trivial batches (16×8 floats), workers 0",
                 "values": [(v - 1) * 100 for v in values],
                 "note": "%.1f µs per batch unpatched; %d batches per block, epochs "
                         "iterated in full" % (base, epochs * n // 16)})
    if not QUICK:
        def measure2():
            loader = DataLoader(ds, batch_size=16, num_workers=2, persistent_workers=True)
            for _batch in loader:       # first epoch starts the workers: not timed
                pass
            nb = 0
            t0 = time.perf_counter()
            for _ in range(2):
                for _batch in loader:
                    nb += 1
            dt = (time.perf_counter() - t0) / nb
            del loader
            return dt
        # 30 pairs: with 12 the min-max spanned -15 % to +37 % (inter-process
        # transfer on 2 busy cores); 11b times the per-batch work alone.
        values = paired_blocks(measure2, 30, "ratio")
        rows.append({"name": "5b trivial batches, 2 fork workers (persistent, after "
                             "the first epoch)",
                     "values": [(v - 1) * 100 for v in values],
                     "note": "dominated by inter-process transfer; noisy on a shared "
                             "2-core machine (11b: the watch's own work per batch)"})
    return rows


# ---------------------------------------------------------------- figure 6

def fig6():
    blocks, iters = (4, 1000) if QUICK else (16, 5000)
    rows = []

    def modern():
        t0 = time.perf_counter()
        for _ in range(iters):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                pass
        return (time.perf_counter() - t0) / iters

    def legacy():
        t0 = time.perf_counter()
        for _ in range(iters):
            with torch.cuda.amp.autocast(enabled=False):
                pass
        return (time.perf_counter() - t0) / iters

    for name, fn in (("6a `torch.autocast(\"cpu\", dtype=torch.bfloat16)` enter+exit", modern),
                     ("6b legacy `torch.cuda.amp.autocast(enabled=False)` enter+exit",
                      legacy)):
        for on in (False, True):
            set_state(on)
            fn()
        values = paired_blocks(fn, blocks, "diff_us")
        set_state(False)
        base = fn() * 1e6
        set_state(True)
        rows.append({"name": name, "values": values,
                     "note": "unpatched: %.2f µs per with-block (default warning "
                             "filters)" % base})
    return rows


def main():
    warnings.simplefilter("default")
    figs = sys.argv[1:] or ["3", "5", "6"]
    out = {"patched_attrs": diff(PRISTINE, PATCHED), "rows": {}}
    for f in figs:
        out["rows"][f] = {"3": fig3, "5": fig5, "6": fig6}[f]()
    out["bad_revert"] = sorted(STATE["bad_revert"])
    out["interventions"] = sorted({i.code for i in autosafe_torch.interventions()})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
