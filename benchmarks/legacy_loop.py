"""Figure 7: the legacy training loop of issue 14, one configuration per run.

``python legacy_loop.py make DIR``: packs IMAGES raw 184×184×3 uint8 images
into DIR/images.bin (smooth random images, written once).

``python legacy_loop.py run DIR --dataset legacy|handsafe|stuck --workers K
[--start spawn|fork] [--persistent] [--epochs E]``: iterates a
DataLoader (batch 16, 64 batches per epoch) and trains a model on it, as a
training script does: after ``DataLoader(...)`` it builds a small conv net
and its optimizer (``torch.optim.SGD``: building any optimizer imports
``torch._dynamo``, which sets ``TORCHINDUCTOR_CACHE_DIR`` in ``os.environ``
after the loader was built), then runs forward, backward and ``step()`` on
every batch (about 25 ms on one core; the step runs on one intra-op thread,
``--intra-op``, and competes with the workers for the CPU, as on a laptop
without an accelerator). Each sample also carries the pid of the process
that fetched it and that process's parent. Prints one
JSON line: each epoch's time (from ``iter(loader)`` to the end of the last
step, so the first includes starting the workers), the part of it spent
checking batches, the time of the setup (model and optimizer), the whole
run (from ``DataLoader(...)`` to the end of the last epoch), a checksum of
the images, one of the per-sample random draws, who started the workers
(this process, or a fork server) and how many there were, whether the warm
server was starting just after ``DataLoader(...)`` (started ahead), and what
autosafe_torch did.

Datasets (each sample: read from the packed file, three cv2.GaussianBlur,
a resize to 224×224, HWC -> CHW tensor, a label, and one ``torch.randint``
draw, which shows the worker seeding: the same with the same W workers on
every rung, another with ``num_workers=0``):

- ``legacy`` opens the packed file in ``__init__`` and seeks and reads: it
  does not pickle, so spawn workers fail without autosafe_torch; with it,
  DL201 repairs it (the file reopened by path in each worker), and DL209
  starts the workers warm.
- ``handsafe`` is the hand-written fix: the path travels, each process
  opens its own file.
- ``stuck`` is ``legacy`` holding also a generator, set after
  construction: nothing makes it pickle and no new build gives it, so the
  ladder takes the next rung (fork on Linux, emulated workers in process
  where fork is unsafe: ``AUTOSAFE_TORCH_AS=macos``).

``--wrap``: the dataset inside
``Forwarding``, a wrapper that forwards attributes with ``__getattr__``
(figure 14). ``--intra-op N``: the step's
``torch.set_num_threads`` (default 1; 0: torch's default, one per core).
"""

import json
import os
import sys
import time

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

IMAGES, SIDE = 1024, 184
BATCH, BATCHES = 16, 64
WIDTH = 12  # the conv net's first layer: a step of about 25 ms on one core
# The training step's intra-op threads (torch.set_num_threads), the same in
# every variant; None: torch's default (one per core). With 2 workers on 2
# cores, torch's OpenMP threads wait at every barrier for a core a worker
# holds; on a busy 2-core machine the default makes the step 3-5x slower.
INTRA_OP_THREADS = 1


def make(directory, seed=0):
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, "images.bin.tmp")
    with open(tmp, "wb") as f:
        for _ in range(IMAGES):
            low = rng.integers(0, 256, size=(12, 12, 3), dtype=np.uint8)
            f.write(cv2.resize(low, (SIDE, SIDE), interpolation=cv2.INTER_CUBIC).tobytes())
    os.replace(tmp, os.path.join(directory, "images.bin"))


def transform(raw):
    img = np.frombuffer(raw, dtype=np.uint8).reshape(SIDE, SIDE, 3)
    for _ in range(3):
        img = cv2.GaussianBlur(img, (11, 11), 0)
    img = cv2.resize(img, (224, 224), interpolation=cv2.INTER_LINEAR)
    return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))


class LegacyDataset(Dataset):
    """Opens its packed file in __init__, as many legacy datasets do."""

    def __init__(self, directory):
        self.f = open(os.path.join(directory, "images.bin"), "rb")

    def __len__(self):
        return BATCH * BATCHES

    def read(self, i):
        size = SIDE * SIDE * 3
        self.f.seek((i % IMAGES) * size)
        return self.f.read(size)

    def __getitem__(self, i):
        return (transform(self.read(i)), i % 10, torch.randint(1 << 30, ()).item(),
                (os.getpid(), os.getppid()))


class HandSafeDataset(LegacyDataset):
    """The hand-written fix: the path travels, each process opens its own."""

    def __init__(self, directory):
        self.path = os.path.join(directory, "images.bin")
        self.f = None

    def __getstate__(self):
        return dict(self.__dict__, f=None)

    def read(self, i):
        if self.f is None:
            self.f = open(self.path, "rb")
        return super().read(i)


class StuckDataset(LegacyDataset):
    """Holds a generator too, given after construction (``stuck``): no repair
    makes it pickle, and no new build from its constructor's arguments gives
    it (the rebuild rung refuses it)."""


class Forwarding(Dataset):
    """A user's wrapper that forwards every attribute it lacks to the dataset it
    wraps. Unpickling it recurses (pickle asks the new, empty instance for
    ``__setstate__``, which asks for ``self.inner``...): a RecursionError in
    each spawned worker without autosafe_torch; DL201 pickles it by its
    attributes."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        return self.inner[i]


def build_model(width=WIDTH):
    """The program's own setup after ``DataLoader(...)``: a small conv net for
    224x224 images, 10 classes, and its optimizer. Building the optimizer
    imports ``torch._dynamo`` (over a second, the first time), which sets
    ``TORCHINDUCTOR_CACHE_DIR`` in ``os.environ``."""
    nn = torch.nn
    model = nn.Sequential(
        nn.Conv2d(3, width, 5, stride=4, padding=2), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, optimizer


def train_step(model, optimizer, x, labels):
    """forward, backward, step() on one batch; the loss."""
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x.float().div_(255)), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


def started_by(pids):
    """Who started the processes that fetched the samples: ``parent`` (this
    process: fork or plain spawn), ``server`` (a fork server), ``none`` (this
    process fetched them: num_workers=0 or emulated workers); with the count
    of distinct worker processes."""
    me = os.getpid()
    kinds = sorted({"none" if pid == me else "parent" if ppid == me else "server"
                    for pid, ppid in pids})
    return {"kinds": kinds, "workers": len({pid for pid, _ in pids if pid != me})}


def server_ahead():
    """Whether autosafe_torch's warm server (DL209) is starting, or runs, just
    after ``DataLoader(...)``: started ahead, its imports overlap the setup."""
    import threading

    warmstart = sys.modules.get("autosafe_torch.remedies.warmstart")
    if warmstart is None:
        return False
    return warmstart._state.get("server") is not None or any(
        t.name == "autosafe_torch warm start" for t in threading.enumerate())


def run(directory, dataset, workers, start, epochs, persistent,
        intra_op=INTRA_OP_THREADS, wrap=False):
    import multiprocessing

    if intra_op:
        torch.set_num_threads(intra_op)
    if start:
        multiprocessing.set_start_method(start, force=True)
    torch.manual_seed(0)
    cls = {"legacy": LegacyDataset, "handsafe": HandSafeDataset, "stuck": StuckDataset}[dataset]
    cache_dir_before = "TORCHINDUCTOR_CACHE_DIR" in os.environ
    t_run = time.perf_counter()
    ds = cls(directory)
    if dataset == "stuck":
        ds.pending = (n for n in ())  # set after construction: a new build lacks it
    ds = Forwarding(ds) if wrap else ds
    loader = DataLoader(ds, batch_size=BATCH, num_workers=workers,
                        persistent_workers=persistent)
    ahead = server_ahead()
    t_setup = time.perf_counter()
    model, optimizer = build_model()
    setup_s = time.perf_counter() - t_setup
    cache_dir_set = not cache_dir_before and "TORCHINDUCTOR_CACHE_DIR" in os.environ
    images, draws, epoch_s, check_s, pids = [], [], [], [], set()
    for _ in range(epochs):
        t0 = time.perf_counter()
        checking = 0.0
        for x, labels, drawn, (pid, ppid) in loader:
            # The batch check is ours, not the loop's: numpy's sum runs on this
            # thread. torch's x.sum() would open an OpenMP region on torch's 2
            # intra-op threads, which stalls while 2 workers hold both cores
            # (measured: 11-23 ms a batch with workers, 2 ms without).
            c0 = time.perf_counter()
            images.append(int(x.numpy().sum(dtype=np.int64)))
            draws.append(tuple(drawn.tolist()))
            pids.update(zip(pid.tolist(), ppid.tolist()))
            checking += time.perf_counter() - c0
            train_step(model, optimizer, x, labels)
        epoch_s.append(time.perf_counter() - t0)
        check_s.append(checking)
    run_s = time.perf_counter() - t_run
    mod = sys.modules.get("autosafe_torch")
    out = {"epoch_s": epoch_s, "check_s": check_s, "setup_s": setup_s, "run_s": run_s,
           "intra_op_threads": torch.get_num_threads(), "server_ahead": ahead,
           "cache_dir_set_by_setup": cache_dir_set, "batches": len(images),
           "started_by": started_by(pids),
           "images": hash(tuple(images)) & 0xFFFFFFFF, "draws": hash(tuple(draws)) & 0xFFFFFFFF,
           "autosafe_active": bool(mod and mod.is_active()),
           "interventions": sorted({"%s:%s" % (i.code, i.strategy or "")
                                    for i in mod.interventions()}) if mod else []}
    print(json.dumps(out), flush=True)


def main(argv):
    if argv[0] == "make":
        make(argv[1])
        return
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("cmd")
    p.add_argument("directory")
    p.add_argument("--dataset", default="legacy")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--start", default=None)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--wrap", action="store_true",
                   help="wrap the dataset in Forwarding (a __getattr__ forwarder)")
    p.add_argument("--intra-op", type=int, default=INTRA_OP_THREADS,
                   help="torch.set_num_threads for the training step; 0: torch's default")
    a = p.parse_args(argv)
    run(a.directory, a.dataset, a.workers, a.start, a.epochs, a.persistent, a.intra_op,
        a.wrap)


if __name__ == "__main__":
    main(sys.argv[1:])
