"""Figure 16: the ordinary GPU script under autosafe_torch costs nothing.

CUDA initialised in the parent, then fork workers that never touch it: what
PyTorch supports and most Linux GPU training is. The shim must leave it on
fork (DL205 acts only once a worker touches CUDA). Before, it moved such
loaders to spawn, which pickles the dataset into each worker: 2.8x the time
and 1.9x the parent's peak memory on a 200 MB in-memory array.

A 256 MiB in-memory float32 array (rows of 3x64x64) held by the dataset, 2
fork workers, 2 epochs, a small model and its optimizer built after the
DataLoader, forward/backward/step per batch. Without a GPU, CUDA is
initialised in the parent by tests/platform_sim (``AUTOSAFE_TEST_CUDA``),
as ``model.cuda()`` leaves it; on a GPU the model is moved to it for real,
and ``--gpu-loop`` measures a real training loop instead: CPU data,
pin_memory, AMP, 6 workers, throughput shim / plain.

Variants ``plain`` and ``shim`` alternate, each in a fresh process.
Measured: the loop's wall time, and peak memory: the parent's peak RSS plus,
per epoch, the sum of the peak RSS of every process below it (the largest
epoch; ``memmap.Peaks``). Every run sums every batch: all must agree.

    python benchmarks/fork_after_cuda.py [--mib 256] [--reps 3] [--gpu-loop]
"""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import QUICK, ROOT, Row, child_env, json_child, median  # noqa: E402
from memmap import Peaks, _hwm  # noqa: E402

SHAPE = (3, 64, 64)
VARIANTS = ("plain", "shim")
PLATFORM_SIM = ROOT / "tests" / "platform_sim"


class InMemory:
    def __init__(self, images):
        self.images = images

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        import torch

        return torch.from_numpy(self.images[i].copy()), i % 10


def child(mib, epochs, gpu_loop):
    import numpy as np
    import torch
    from torch.utils.data import DataLoader

    rows = mib * (1 << 20) // (4 * int(np.prod(SHAPE)))
    images = np.random.default_rng(0).standard_normal((rows,) + SHAPE, dtype=np.float32)
    cuda = torch.cuda.is_available()
    peaks = Peaks()
    peaks.start()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    loader = DataLoader(InMemory(images), batch_size=64, shuffle=True,
                        num_workers=6 if gpu_loop else 2, pin_memory=gpu_loop)
    device = "cuda" if cuda else "cpu"
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(SHAPE)), 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler(device, enabled=gpu_loop)
    assert torch.cuda.is_initialized(), "CUDA is not initialised: nothing is measured"
    check, samples = 0.0, 0
    for epoch in range(epochs):
        peaks.epoch = epoch
        for x, y in loader:
            check += float(x.double().sum())
            samples += len(x)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad()
            with torch.autocast(device, enabled=gpu_loop):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    peaks.stop = True
    peaks.join()
    parent = _hwm(os.getpid())
    print(json.dumps({"wall_s": wall, "throughput": samples / wall, "parent": parent,
                      "workers": peaks.workers_peak(), "memory": parent + peaks.workers_peak(),
                      "check": check}))


def measure(mib=256, reps=3, epochs=2, gpu_loop=False):
    import torch

    simulated = {} if torch.cuda.is_available() else {
        "PYTHONPATH": str(PLATFORM_SIM), "AUTOSAFE_TEST_CUDA": "initialised"}
    envs = {"shim": dict(simulated, AUTOSAFE_TORCH="1", AUTOSAFE_TORCH_QUIET="1"),
            "plain": dict(simulated, AUTOSAFE_TORCH="0")}
    runs = {v: [] for v in VARIANTS}
    args = [str(mib), str(epochs), "1" if gpu_loop else "0"]
    for r in range(reps):
        for variant in VARIANTS[r % 2:] + VARIANTS[:r % 2]:
            runs[variant].append(json_child([__file__, "child"] + args,
                                            child_env(envs[variant]), timeout=600))
    return runs


def ratios(runs, key):
    return [a[key] / b[key] for a, b in zip(runs["shim"], runs["plain"])]


def figures():
    runs = measure(mib=64 if QUICK else 256, reps=1 if QUICK else 3, epochs=2)
    same = len({round(r["check"], 3) for v in runs.values() for r in v}) == 1
    note = "; ".join("%s %.1f s, %.2f GiB" % (v, median([r["wall_s"] for r in runs[v]]),
                                              median([r["memory"] for r in runs[v]]) / 2**30)
                     for v in VARIANTS)
    note += " (median); the same data in every run: %s" % ("yes" if same else "NO")
    return [
        Row(16, "16a CUDA initialised, fork workers that never touch it (256 MiB in memory, "
            "2 workers): time, shim / plain", 1.02, "le", "x", ratios(runs, "wall_s"), note),
        Row(16, "16b the same: peak memory (parent + workers' peak RSS), shim / plain", 1.05,
            "le", "x", ratios(runs, "memory"), "the shim leaves the loader on fork"),
    ]


def main(argv):
    if argv[:1] == ["child"]:
        return child(int(argv[1]), int(argv[2]), argv[3] == "1")
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--gpu-loop", action="store_true",
                   help="a real GPU training loop: pin_memory, AMP, 6 workers")
    a = p.parse_args(argv)
    runs = measure(a.mib, a.reps, a.epochs, a.gpu_loop)
    for v in VARIANTS:
        for r in runs[v]:
            print("%-5s wall %6.2f s  %8.1f samples/s  memory %5.2f GiB (parent %4.2f, "
                  "workers %4.2f)  check %.3f" % (
                      v, r["wall_s"], r["throughput"], r["memory"] / 2**30,
                      r["parent"] / 2**30, r["workers"] / 2**30, r["check"]))
    print("time shim / plain %.3fx (goal <= 1.02x); throughput shim / plain %.3fx (goal >= "
          "0.98x on a GPU); peak memory shim / plain %.3fx (goal <= 1.05x)" % (
              median(ratios(runs, "wall_s")), median(ratios(runs, "throughput")),
              median(ratios(runs, "memory"))))


if __name__ == "__main__":
    main(sys.argv[1:])
