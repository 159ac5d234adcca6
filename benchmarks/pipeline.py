"""Figures 7 and 8: a CPU-bound image pipeline whose dataset holds an open file.

``python pipeline.py make DIR N``: writes N synthetic JPEG images (cv2.imencode)
into DIR/images.bin, with their offsets and lengths in DIR/index.npy.

``python pipeline.py run DIR --dataset plain|handsafe --workers K
--start spawn --epochs E``: iterates a DataLoader over the images and prints
one JSON line: the time of each epoch (from ``iter(loader)`` to the last
batch, so the first epoch includes starting the workers), a checksum of
every batch in order, and what autosafe_torch and cv2 did.

``plain`` holds ``open(path, "rb")`` from ``__init__``, seeks and reads: it
does not pickle, so spawn workers fail without autosafe_torch (DL201).
``handsafe`` is the hand-written fix: it keeps the path and opens the file
on first use in each process.

Each sample: read, ``cv2.imdecode``, a crop, ``cv2.resize`` to 224×224, a
horizontal flip on odd indices, normalisation, HWC -> CHW tensor.
"""

import json
import os
import sys
import time

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32) * 255
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32) * 255
SIZE = (384, 512)   # source images, H×W


def make(directory, n, seed=0):
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    offsets, lengths = [], []
    pos = 0
    tmp = os.path.join(directory, "images.bin.tmp")
    with open(tmp, "wb") as f:
        for i in range(n):
            low = rng.integers(0, 256, size=(12, 16, 3), dtype=np.uint8)
            img = cv2.resize(low, (SIZE[1], SIZE[0]), interpolation=cv2.INTER_CUBIC)
            noise = rng.normal(0, 6, size=img.shape)
            img = np.clip(img + noise, 0, 255).astype(np.uint8)
            ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])
            assert ok
            data = buf.tobytes()
            f.write(data)
            offsets.append(pos)
            lengths.append(len(data))
            pos += len(data)
    np.save(os.path.join(directory, "index.npy"), np.array([offsets, lengths], dtype=np.int64))
    os.replace(tmp, os.path.join(directory, "images.bin"))


def transform(buf, i):
    img = cv2.imdecode(np.frombuffer(buf, dtype=np.uint8), cv2.IMREAD_COLOR)
    h, w = img.shape[:2]
    dy, dx = (i * 7) % 32, (i * 13) % 32        # a deterministic "random" crop
    img = img[dy:h - 32 + dy, dx:w - 32 + dx]
    img = cv2.resize(img, (224, 224), interpolation=cv2.INTER_LINEAR)
    if i % 2:
        img = cv2.flip(img, 1)
    x = (img.astype(np.float32) - MEAN) / STD
    return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))


class PlainFileDataset(Dataset):
    """Holds an open file, as many legacy datasets do."""

    def __init__(self, directory):
        self.index = np.load(os.path.join(directory, "index.npy"))
        self.f = open(os.path.join(directory, "images.bin"), "rb")

    def __len__(self):
        return self.index.shape[1]

    def __getitem__(self, i):
        off, length = self.index[:, i]
        self.f.seek(int(off))
        buf = self.f.read(int(length))
        return transform(buf, i), i % 10, cv2.getNumThreads()


class HandSafeFileDataset(Dataset):
    """The hand-written fix: the path travels, each process opens its own."""

    def __init__(self, directory):
        self.index = np.load(os.path.join(directory, "index.npy"))
        self.path = os.path.join(directory, "images.bin")
        self._f = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_f"] = None
        return state

    def __len__(self):
        return self.index.shape[1]

    def __getitem__(self, i):
        if self._f is None:
            self._f = open(self.path, "rb")
        off, length = self.index[:, i]
        self._f.seek(int(off))
        buf = self._f.read(int(length))
        return transform(buf, i), i % 10, cv2.getNumThreads()


def run(directory, dataset, workers, start, epochs, batch_size=32):
    import multiprocessing

    if start:
        multiprocessing.set_start_method(start, force=True)
    cls = {"plain": PlainFileDataset, "handsafe": HandSafeFileDataset}[dataset]
    ds = cls(directory)
    kwargs = dict(batch_size=batch_size, shuffle=False, num_workers=workers)
    if workers:
        kwargs["persistent_workers"] = True
    loader = DataLoader(ds, **kwargs)
    epoch_s, sums, worker_threads = [], [], set()
    for _ in range(epochs):
        t0 = time.perf_counter()
        for images, labels, threads in loader:
            sums.append(round(float(images.double().sum()), 3))
            worker_threads.update(int(t) for t in threads.unique())
        epoch_s.append(time.perf_counter() - t0)
    out = {"epoch_s": epoch_s, "checksum": hash(tuple(sums)) & 0xFFFFFFFF,
           "batches": len(sums), "worker_cv2_threads": sorted(worker_threads),
           "parent_cv2_threads": cv2.getNumThreads(),
           "parent_opencl": bool(cv2.ocl.useOpenCL())}
    mod = sys.modules.get("autosafe_torch")
    out["autosafe_active"] = bool(mod and mod.is_active())
    out["interventions"] = sorted({"%s:%s" % (i.code, i.strategy or "")
                                   for i in mod.interventions()}) if mod else []
    print(json.dumps(out), flush=True)


def main(argv):
    if argv[0] == "make":
        make(argv[1], int(argv[2]))
        return
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("cmd")
    p.add_argument("directory")
    p.add_argument("--dataset", default="plain")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--start", default="spawn")
    p.add_argument("--epochs", type=int, default=2)
    a = p.parse_args(argv)
    run(a.directory, a.dataset, a.workers, a.start, a.epochs)


if __name__ == "__main__":
    main(sys.argv[1:])
