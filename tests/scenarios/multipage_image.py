"""A dataset that holds a multi-page TIFF open (PIL), one frame per sample.

python multipage_image.py [KIND] [WORKERS]

KIND:
- held (default): ``Image.open(path)`` in ``__init__``, ``self.img.seek(i)`` per
  sample. PIL pickles the image as one frame's pixels and drops the file:
  spawn workers (macOS, Windows, Linux from Python 3.14) fail with
  ``'TiffImageFile' object has no attribute '_min_frame'``;
- deleted: the same, its file deleted once opened (no path opens it again);
- single: a single-page image held open, read without seeking (its pickle,
  the pixels, is all it needs);
- lazy: the TIFF opened lazily in ``__getitem__``, once per process.

WORKERS: 2 by default; 0 is the reference, which no start method can change:
no workers, and each sample's worker id the one that round robin gives its
batch (batch k goes to worker k % 2). Each sample: its frame's pixels and
the worker id. Prints ``BATCHES <sha256>`` and ``PIDS`` (worker processes
that fetched, not this one). The image is written with Pillow under
``SCENARIO_TMP``.
"""

import hashlib
import os
import sys
import tempfile

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, get_worker_info

FRAMES, BATCH, WORKERS = 12, 3, 2


def frame(k):
    return ((np.arange(48, dtype=np.int64).reshape(6, 8) + 17 * k) % 251).astype(np.uint8)


def write_tiff(where):
    path = os.path.join(where, "frames.tif")
    pages = [Image.fromarray(frame(k)) for k in range(FRAMES)]
    pages[0].save(path, save_all=True, append_images=pages[1:])
    return path


def write_png(where):
    path = os.path.join(where, "page.png")
    Image.fromarray(frame(5)).save(path)
    return path


def sample(pixels, i):
    info = get_worker_info()
    return (torch.from_numpy(np.asarray(pixels, dtype=np.uint8).copy()).float() + i,
            -1 if info is None else info.id, os.getpid())


class Frames(Dataset):
    def __init__(self, path):
        self.img = Image.open(path)

    def __len__(self):
        return FRAMES

    def __getitem__(self, i):
        self.img.seek(i)
        return sample(self.img, 0)


class OnePage(Frames):
    def __getitem__(self, i):
        return sample(self.img, i)


class LazyFrames(Dataset):
    def __init__(self, path):
        self.path, self.img, self.pid = path, None, None

    def __len__(self):
        return FRAMES

    def __getitem__(self, i):
        if self.pid != os.getpid():
            self.img, self.pid = Image.open(self.path), os.getpid()
        self.img.seek(i)
        return sample(self.img, 0)


def main():
    kind = sys.argv[1] if len(sys.argv) > 1 else "held"
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else WORKERS
    where = tempfile.mkdtemp(dir=os.environ.get("SCENARIO_TMP"))
    if kind == "single":
        dataset = OnePage(write_png(where))
    elif kind == "lazy":
        dataset = LazyFrames(write_tiff(where))
    else:
        dataset = Frames(write_tiff(where))
        if kind == "deleted":
            os.unlink(dataset.img.filename)
    loader = DataLoader(dataset, batch_size=BATCH, num_workers=workers)
    h, pids = hashlib.sha256(), set()
    for k, (pixels, worker, pid) in enumerate(loader):
        if workers == 0:
            worker = torch.full_like(worker, k % WORKERS)  # the worker round robin gives it
        h.update(pixels.numpy().tobytes())
        h.update(worker.numpy().astype(np.int64).tobytes())
        pids.update(pid.tolist())
    print("BATCHES", h.hexdigest(), flush=True)
    print("PIDS", len(pids - {os.getpid()}), flush=True)


if __name__ == "__main__":
    main()
