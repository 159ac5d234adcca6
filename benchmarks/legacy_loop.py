"""Figure 7: the legacy training loop of issue 14, one configuration per run.

``python legacy_loop.py make DIR``: packs IMAGES raw 184×184×3 uint8 images
into DIR/images.bin (smooth random images, written once).

``python legacy_loop.py run DIR --dataset legacy|handsafe|stuck --workers K
[--start spawn|fork] [--persistent] [--threads] [--epochs E]``: iterates a
DataLoader (batch 16, 64 batches per epoch) with a training step that sleeps
32 ms, as an accelerator step waits without using the CPU, and prints one
JSON line: each epoch's time (from ``iter(loader)`` to the end of the last
step, so the first includes starting the workers), the part of it spent
checking batches, a checksum of the images, one of the per-sample random draws, and what autosafe_torch did.

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
- ``stuck`` is ``legacy`` holding also a generator: nothing makes it
  pickle, so the ladder takes the next rung (fork on Linux, emulated
  workers in process where fork is unsafe: ``AUTOSAFE_TORCH_AS=macos``).

``--setup S``: S seconds of the program's own setup (building a model, on
this thread) between building the loader and iterating it, as a training
script does; the first epoch is timed from ``iter(loader)`` as ever.

``--threads``: the loader's workers emulated on a thread
(``EmulatedWorkersIter(loader, threaded=True)``), iterated directly: the
ladder does not choose that rung by itself.
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
BATCH, BATCHES, STEP_S = 16, 64, 0.032


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
        return transform(self.read(i)), i % 10, torch.randint(1 << 30, ()).item()


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
    """Holds a generator too: no repair makes it pickle."""

    def __init__(self, directory):
        super().__init__(directory)
        self.pending = (n for n in ())


def setup(seconds):
    """The program's own setup between building the loader and iterating it:
    building a model (layers initialised on this thread), for ``seconds``."""
    end = time.perf_counter() + seconds
    layers = []
    while time.perf_counter() < end:
        layers.append(torch.nn.Linear(256, 256))
        del layers[:-8]


def run(directory, dataset, workers, start, epochs, persistent, threads, setup_s=0.0):
    import multiprocessing

    if start:
        multiprocessing.set_start_method(start, force=True)
    torch.manual_seed(0)
    cls = {"legacy": LegacyDataset, "handsafe": HandSafeDataset, "stuck": StuckDataset}[dataset]
    loader = DataLoader(cls(directory), batch_size=BATCH, num_workers=workers,
                        persistent_workers=persistent)
    if setup_s:
        rng = torch.get_rng_state()
        setup(setup_s)
        torch.set_rng_state(rng)  # the batches stay those of a run without setup
    images, draws, epoch_s, check_s = [], [], [], []
    for _ in range(epochs):
        t0 = time.perf_counter()
        if threads:
            from autosafe_torch.remedies.emulated_workers import EmulatedWorkersIter

            batches = EmulatedWorkersIter(loader, threaded=True)
        else:
            batches = loader
        checking = 0.0
        for x, _labels, drawn in batches:
            # The batch check is ours, not the loop's: numpy's sum runs on this
            # thread. torch's x.sum() would open an OpenMP region on torch's 2
            # intra-op threads, which stalls while 2 workers hold both cores
            # (measured: 11-23 ms a batch with workers, 2 ms without).
            c0 = time.perf_counter()
            images.append(int(x.numpy().sum(dtype=np.int64)))
            draws.append(tuple(drawn.tolist()))
            checking += time.perf_counter() - c0
            time.sleep(STEP_S)                   # the accelerator's step
        epoch_s.append(time.perf_counter() - t0)
        check_s.append(checking)
    mod = sys.modules.get("autosafe_torch")
    out = {"epoch_s": epoch_s, "check_s": check_s, "batches": len(images),
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
    p.add_argument("--threads", action="store_true")
    p.add_argument("--setup", type=float, default=0.0)
    a = p.parse_args(argv)
    run(a.directory, a.dataset, a.workers, a.start, a.epochs, a.persistent, a.threads,
        a.setup)


if __name__ == "__main__":
    main(sys.argv[1:])
