"""Figure 4: the picklability probe against dataset size.

``python probe_cost.py time SIZES_MB...``: builds one dataset per size (a
map-style dataset holding a uint8 image tensor of that many bytes, int64
labels and a class list), then probes them in turn, round after round (the
sizes alternate, so that drift hits all alike). Each call probes a fresh
dataset object around the same tensors, so that nothing cached per object
can answer. Prints per-size times (ms) and, measured once per size with
tracemalloc on, the peak of Python allocations made during the probe.

``python probe_cost.py rss SIZE_MB``: in a fresh process, the growth of the
peak resident set (ru_maxrss) over one probe of a dataset of that size,
built and touched before the probe (the probe's code warmed on a small
one first).
"""

import gc
import json
import os
import resource
import sys
import time
import tracemalloc

QUICK = os.environ.get("BENCH_QUICK", "").strip() not in ("", "0")

import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402


class ImageTensorDataset(Dataset):
    def __init__(self, images, labels):
        self.images = images
        self.labels = labels
        self.classes = ["class_%d" % i for i in range(10)]
        self.transform = None

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


def tensors(size_mb):
    per = 3 * 64 * 64                      # one 64×64 RGB uint8 image
    n = max(1, int(size_mb * 1024 * 1024) // per)
    images = torch.full((n, 3, 64, 64), 7, dtype=torch.uint8)   # written: resident
    labels = torch.arange(n, dtype=torch.int64) % 10
    return images, labels


def load_probe():
    try:
        from autosafe_torch.inspection import probe as mod
    except ImportError as exc:
        return None, "autosafe_torch.inspection.probe is missing (%s)" % exc
    fn = getattr(mod, "probe", None)
    if fn is None:
        return None, "autosafe_torch.inspection.probe has no probe()"
    return fn, None


def maxrss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # KiB on Linux


def main_time(sizes):
    fn, why = load_probe()
    if fn is None:
        print(json.dumps({"na": why}))
        return
    data = {s: tensors(s) for s in sizes}
    t0 = time.perf_counter()
    first = fn(ImageTensorDataset(*tensors(0.01)))
    first_ms = (time.perf_counter() - t0) * 1000
    result_repr = repr(first)[:120]
    rounds = 5 if QUICK else 30
    times = {s: [] for s in sizes}
    for r in range(rounds):
        order = sizes if r % 2 == 0 else list(reversed(sizes))
        for s in order:
            ds = ImageTensorDataset(*data[s])
            t0 = time.perf_counter()
            fn(ds)
            times[s].append((time.perf_counter() - t0) * 1000)
    traced = {}
    for s in sizes:
        ds = ImageTensorDataset(*data[s])
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        fn(ds)
        traced[s] = (tracemalloc.get_traced_memory()[1] - before) / 1e6
        tracemalloc.stop()
    print(json.dumps({"times_ms": {str(s): v for s, v in times.items()},
                      "traced_peak_mb": {str(s): v for s, v in traced.items()},
                      "first_call_ms": first_ms, "result": result_repr}))


def main_rss(size):
    fn, why = load_probe()
    if fn is None:
        print(json.dumps({"na": why}))
        return
    fn(ImageTensorDataset(*tensors(0.01)))     # imports and warm caches
    data = tensors(size)
    ds = ImageTensorDataset(*data)
    gc.collect()
    before = maxrss_bytes()
    fn(ds)
    after = maxrss_bytes()
    print(json.dumps({"rss_growth_mb": (after - before) / 1e6,
                      "maxrss_before_mb": before / 1e6}))


if __name__ == "__main__":
    if sys.argv[1] == "time":
        main_time([float(x) for x in sys.argv[2:]])
    else:
        main_rss(float(sys.argv[2]))
