"""Figure 17: a tensor mapped from a file under spawn (DL218), against the
hand fix.

A 200 MB token file (``torch.save`` of one int64 tensor), loaded with
``torch.load(path, mmap=True)``; 2 spawn workers, 3 epochs; each sample is a
window of the tokens (the windows cover the whole file: every worker reads
it all), its first 128 tokens the input and the next the target of a small
language model (embedding, linear) and its optimizer built after the
DataLoader, forward/backward/step per batch on one intra-op thread (the
workers have the other cores). Variants, each in a fresh process,
alternating:

- ``shim``: the dataset holds the loaded tensor, under autosafe_torch
  (DL218: mapped again in each worker);
- ``hand``: the hand fix, a dataset that keeps the path and calls
  ``torch.load(path, mmap=True)`` lazily in ``__getitem__`` (in each worker);
- ``plain``: the loaded tensor without the shim (torch's reducer copies the
  storage into ``/dev/shm`` in the training process, for the tensor's life).

Measured: the wall time of the loop (DataLoader to the last step); peak
memory: the parent's peak RSS (VmHWM) plus, per epoch, the sum of the peak
RSS of every process below it, the largest epoch (as ``memmap.Peaks``, from
a monitor process: a sampling thread would open files in the measured
process while its workers start); and ``/dev/shm``: the most of it that the
process tree maps (each file once, sampled every 20 ms: the batches in
flight pass through it in every variant), and the rise of its used bytes on
the machine (which counts other programs too). File pages and shared memory a process touched count in its
RSS in every variant. Each run sums every batch: all must agree.

    python benchmarks/mapped_tensor.py [--mb 200] [--reps 2] [--epochs 3]
"""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import QUICK, RESULTS_DIR, Row, child_env, json_child, median  # noqa: E402
from memmap import _descendants, _hwm  # noqa: E402

VARIANTS = ("shim", "hand", "plain")
SAMPLES, SEQ, VOCAB = 4096, 128, 256


# ------------------------------------------------------------------ the child

def shm_used():
    """Used bytes of /dev/shm, whoever holds them."""
    s = os.statvfs("/dev/shm")
    return (s.f_blocks - s.f_bfree) * s.f_frsize


def tree_shm(pids):
    """Bytes of /dev/shm that the processes ``pids`` map, each file once
    (torch's shared memory: a batch in flight, a storage it moved)."""
    files = {}
    for each in pids:
        try:
            with open("/proc/%d/maps" % each) as f:
                for line in f:
                    fields = line.split(None, 5)
                    if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                        start, end = (int(x, 16) for x in fields[0].split("-"))
                        key = (fields[3], fields[4], int(fields[2], 16))
                        files[key] = max(files.get(key, 0), end - start)
        except (OSError, ValueError):
            continue
    return sum(files.values())


def monitor(pid):
    """In a process of its own (a sampling thread in the measured process
    would open files there while its workers start, and take its GIL): every
    20 ms, each process's peak RSS below ``pid`` by the epoch it was first seen
    in (the epoch comes on stdin), and the most /dev/shm seen. At the end of
    stdin: one JSON line."""
    import select

    me, epoch, seen = os.getpid(), 0, {}
    base = top = shm_used()
    tree = 0
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], 0.02)
        if ready:
            line = sys.stdin.readline()
            if not line:
                break
            epoch = int(line.split()[1])
        below = [p for p in _descendants(pid) if p != me]
        for child in below:
            hwm = _hwm(child)
            if hwm is not None:
                first, old = seen.get(child, (epoch, 0))
                seen[child] = (first, max(old, hwm))
        top = max(top, shm_used())
        tree = max(tree, tree_shm([pid] + below))
    per_epoch = {}
    for first, hwm in seen.values():
        per_epoch[first] = per_epoch.get(first, 0) + hwm
    print(json.dumps({"workers": max(per_epoch.values()) if per_epoch else 0,
                      "shm_tree": tree, "shm_rise": top - base}), flush=True)


class Loaded:
    """The legacy dataset: the tokens loaded (mapped) in __init__."""

    def __init__(self, path):
        import torch

        self.tokens = torch.load(path, mmap=True)["tokens"]
        self.window = len(self.tokens) // SAMPLES

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        part = self.tokens[i * self.window:(i + 1) * self.window]
        return part[:SEQ], part[1:SEQ + 1], part.sum()  # the whole window is read


class Lazy(Loaded):
    """The hand fix: the path, loaded in each worker."""

    def __init__(self, path):
        import torch

        self.path, self.tokens = path, None
        self.window = torch.load(path, mmap=True)["tokens"].numel() // SAMPLES

    def __getitem__(self, i):
        if self.tokens is None:
            import torch

            self.tokens = torch.load(self.path, mmap=True)["tokens"]
        return Loaded.__getitem__(self, i)


DATASETS = {"shim": Loaded, "hand": Lazy, "plain": Loaded}


def child(variant, path, epochs):
    import subprocess

    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)  # the workers have the other cores
    watch = subprocess.Popen([sys.executable, __file__, "monitor", str(os.getpid())],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    loader = DataLoader(DATASETS[variant](path), batch_size=32, shuffle=True,
                        num_workers=2, multiprocessing_context="spawn")
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    check = 0
    for epoch in range(epochs):
        watch.stdin.write("epoch %d\n" % epoch)
        watch.stdin.flush()
        for x, y, total in loader:
            check += int(total.sum())
            opt.zero_grad()
            logits = model(x)
            torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1)).backward()
            opt.step()
    wall = time.perf_counter() - t0
    seen = json.loads(watch.communicate()[0].strip().splitlines()[-1])
    parent = _hwm(os.getpid())
    print(json.dumps(dict(seen, wall_s=wall, parent=parent, memory=parent + seen["workers"],
                          check=check)))


# ------------------------------------------------------------------ the runs

def data_file(mb):
    """``RESULTS_DIR/tokens-<mb>.pt``: ``mb`` MB of int64 tokens below VOCAB."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / ("tokens-%d.pt" % mb)
    count = mb * 10**6 // 8
    if not path.exists():
        import torch

        gen = torch.Generator().manual_seed(0)
        torch.save({"tokens": torch.randint(0, VOCAB, (count,), generator=gen)}, str(path))
    return path


def measure(mb=200, reps=2, epochs=3):
    path = data_file(mb)
    shim, plain = {"AUTOSAFE_TORCH": "1", "AUTOSAFE_TORCH_QUIET": "1"}, {"AUTOSAFE_TORCH": "0"}
    envs = {"shim": shim, "hand": plain, "plain": plain}
    runs = {v: [] for v in VARIANTS}
    for r in range(reps):
        turn = r % len(VARIANTS)
        for variant in VARIANTS[turn:] + VARIANTS[:turn]:
            runs[variant].append(json_child(
                [__file__, "child", variant, str(path), str(epochs)], child_env(envs[variant]),
                timeout=600))
    return runs


def figures():
    runs = measure(mb=50 if QUICK else 200, reps=1 if QUICK else 3, epochs=2 if QUICK else 3)
    same = len({r["check"] for v in runs.values() for r in v}) == 1

    def ratios(key):
        return [a[key] / b[key] for a, b in zip(runs["shim"], runs["hand"])]

    note = "; ".join("%s %.1f s, %.2f GiB, /dev/shm %.1f MiB" % (
        v, median([r["wall_s"] for r in runs[v]]), median([r["memory"] for r in runs[v]]) / 2**30,
        median([r["shm_tree"] for r in runs[v]]) / 2**20) for v in VARIANTS)
    note += " (median; plain: torch copies the storage into /dev/shm); the same data in " \
        "every run: %s" % ("yes" if same else "NO")
    return [
        Row(17, "17a 200 MB torch.load(mmap=True) tensor, 2 spawn workers, 3 epochs: time, "
            "shim / hand fix", 1.1, "le", "x", ratios("wall_s"), note),
        Row(17, "17b the same: peak memory (parent + workers' peak RSS), shim / hand fix", 1.1,
            "le", "x", ratios("memory"), "hand fix: the dataset loads the file in each worker"),
        Row(17, "17c the same: most /dev/shm the shim's process tree maps", 1, "le", " MiB",
            [r["shm_tree"] / 2**20 for r in runs["shim"]],
            "the batches in flight pass through /dev/shm in every variant (hand fix: %.1f "
            "MiB, plain: %.0f MiB); sampled every 20 ms" % (
                median([r["shm_tree"] for r in runs["hand"]]) / 2**20,
                median([r["shm_tree"] for r in runs["plain"]]) / 2**20)),
    ]


def main(argv):
    if argv[:1] == ["child"]:
        return child(argv[1], argv[2], int(argv[3]))
    if argv[:1] == ["monitor"]:
        return monitor(int(argv[1]))
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=int, default=200)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args(argv)
    runs = measure(a.mb, a.reps, a.epochs)
    for v in VARIANTS:
        for r in runs[v]:
            print("%-5s wall %6.2f s  memory %5.2f GiB (parent %4.2f, workers %4.2f)  "
                  "/dev/shm: tree %5.1f MiB, machine +%4.0f MiB  check %d" % (
                      v, r["wall_s"], r["memory"] / 2**30, r["parent"] / 2**30,
                      r["workers"] / 2**30, r["shm_tree"] / 2**20, r["shm_rise"] / 2**20,
                      r["check"]))
    for key, name in (("wall_s", "time"), ("memory", "peak memory")):
        m = {v: median([r[key] for r in runs[v]]) for v in VARIANTS}
        print("%s: shim / hand %.2fx (goal <= 1.1x); plain / hand %.2fx"
              % (name, m["shim"] / m["hand"], m["plain"] / m["hand"]))
    print("/dev/shm of the process tree (median of the peaks): %s" % ", ".join(
        "%s %.1f MiB" % (v, median([r["shm_tree"] for r in runs[v]]) / 2**20)
        for v in VARIANTS))


if __name__ == "__main__":
    main(sys.argv[1:])
