"""Figure 19: the shim's cost at the size people train (issue 41).

Datasets shaped as real ones are, at 10k, 1.28M and 10M samples:

- ``index``: torchvision's ImageFolder index, ``(path, class)`` tuples and the
  targets list (ImageNet: 1,281,167);
- ``captions``: a COCO-style dict of image id -> 5 caption strings (one id
  per 10 samples);
- ``tokens``: pre-tokenised documents, lists of 16 ints (one per 6 samples).

Each run is a process of its own: the dataset built, a loader of 2 workers
(batch 256, shuffled), the model and optimizer built after the loader, then the
first batch, timed from ``iter()``, and a short first epoch (every 97th sample,
a step per batch). ``plain`` is torch alone, ``shim`` with ``AUTOSAFE_TORCH=1``;
``fork`` (Linux's default), ``spawn`` (Linux), ``macos`` (spawn as on macOS).
The parent's peak memory is its ``ru_maxrss``.

- 19a: fork, the shim's extra time to the first batch (s), budget <= 0.05 s;
- 19b: spawn and as on macOS, the first epoch, shim / plain, budget <= 1.05x;
- 19c: the parent's peak memory, shim / plain, budget <= 1.05x (every run);
- 19d: the ImageNet index guarded by a lock (made anew in each worker by the
  shim), as on macOS, the first epoch: shim / the hand fix (the lock made in
  ``__setstate__``, plain spawn), budget <= 1.10x;
- 19e: a tiny healthy fork loader's later epochs: the shim's cost per
  ``iter()`` (ms), budget <= 0.2 ms.

``BENCH_QUICK=1``: 10k and 1.28M only, one run each.
"""

import json
import subprocess
import sys

from common import HERE, QUICK, RESULTS_DIR, Row, child_env, log, median, with_first_epoch

SIZES = (10_000, 1_281_167) if QUICK else (10_000, 1_281_167, 10_000_000)
SHAPES = ("index", "captions", "tokens")
PLATFORMS = {"fork": ("fork", {}), "spawn": ("spawn", {}),
             "macos": (None, {"AUTOSAFE_TORCH_AS": "macos"})}

CHILD = with_first_epoch(r'''
import json, os, random, resource, sys, threading, time
import torch
from torch.utils.data import DataLoader, Dataset

SHAPE, N, METHOD, LOCK = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

class Data(Dataset):
    def __init__(self):
        if SHAPE == "index":
            self.samples = [("/data/train/n%08d/img_%07d.JPEG" % (i % 1000, i), i % 1000)
                            for i in range(N)]
            self.targets = [s[1] for s in self.samples]
            self.n = N
        elif SHAPE == "captions":
            self.captions = {i: ["a photo of thing %d, take %d" % (i, k) for k in range(5)]
                             for i in range(N // 10)}
            self.ids = list(self.captions)
            self.n = len(self.ids) * 5
        else:
            self.docs = [[(i * 31 + k) % 50257 for k in range(16)] for i in range(N // 6)]
            self.n = len(self.docs)
        self.lazy = LOCK == "hand"
        self.guard = threading.Lock() if LOCK == "guarded" else None
    def __setstate__(self, state):
        self.__dict__.update(state)
        if self.lazy:
            self.guard = threading.Lock()
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        if SHAPE == "index":
            value = self.samples[i][1]
        elif SHAPE == "captions":
            value = len(self.captions[self.ids[i // 5]][i % 5])
        else:
            value = self.docs[i][0]
        return torch.tensor([float(value), torch.rand(1).item(), random.random()])

if __name__ == "__main__":
    if METHOD != "default":
        import multiprocessing
        multiprocessing.set_start_method(METHOD)
    torch.manual_seed(0)
    data = Data()
    # common.FIRST_EPOCH
    records = []
    try:
        import autosafe_torch
        records = sorted({r.code for r in autosafe_torch.interventions()})
    except Exception:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"first_batch": first_batch, "epoch": epoch, "peak": peak,
                      "records": records}))
''')

TINY = r'''
import json, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
if __name__ == "__main__":
    loader = DataLoader(TensorDataset(torch.arange(26.)), batch_size=26, num_workers=1,
                        persistent_workers=True)
    for _ in range(3):
        list(loader)
    blocks = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(200):
            iter(loader)  # a persistent loader's next epoch: torch's _reset, and our checks
        blocks.append((time.perf_counter() - t0) / 200)
    print(json.dumps({"blocks": blocks}))
'''


def _child(script, args, shim, extra):
    # A file, as a training script is: spawned workers import its __main__ (a
    # class defined under `python -c` is no worker's to unpickle, and CPython's
    # spawn then hangs writing the rest of a large pickle to the dead child).
    path = RESULTS_DIR / ("size_%s.py" % ("tiny" if script is TINY else "child"))
    if not path.exists() or path.read_text() != script:
        path.write_text(script)
    env = child_env(dict(extra, **({"AUTOSAFE_TORCH": "1", "AUTOSAFE_TORCH_QUIET": "1"}
                                   if shim else {})))
    proc = subprocess.run([sys.executable, str(path)] + [str(a) for a in args], env=env,
                          cwd=str(RESULTS_DIR), capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError("%s failed:\n%s" % (args, proc.stderr[-3000:]))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _pair(shape, size, platform, reps=1, plain_lock="none", shim_lock="none"):
    """``{"plain": [...], "shim": [...]}``: runs of both, alternating."""
    method, env = PLATFORMS[platform]
    out = {"plain": [], "shim": []}
    for r in range(reps):
        for shim in ((False, True) if r % 2 == 0 else (True, False)):
            # As on macOS: the rehearsal sets spawn itself, as a Mac's default is;
            # plain torch runs plain spawn.
            start = method or ("default" if shim else "spawn")
            args = (shape, size, start, shim_lock if shim else plain_lock)
            out["shim" if shim else "plain"].append(
                _child(CHILD, args, shim, env if shim else {}))
    return out


def figures():
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    reps = 1 if QUICK else 2
    rows, curve = [], []
    for shape in SHAPES:
        for size in SIZES:
            if size == 10_000_000 and shape != "index":
                continue
            for platform in PLATFORMS:
                runs = _pair(shape, size, platform, reps=reps)
                plain, shim = runs["plain"], runs["shim"]
                extra = [s["first_batch"] - p["first_batch"] for s, p in zip(shim, plain)]
                ratio = [s["epoch"] / p["epoch"] for s, p in zip(shim, plain)]
                memory = [s["peak"] / p["peak"] for s, p in zip(shim, plain)]
                recorded = sorted({c for s in shim for c in s["records"]})
                log("  %s %s %s: first batch %+.3f s, epoch %.3fx, memory %.3fx%s" % (
                    shape, size, platform, median(extra), median(ratio), median(memory),
                    " records %s" % recorded if recorded else ""))
                curve.append((shape, size, platform, median(p["first_batch"] for p in plain),
                              median(s["first_batch"] for s in shim)))
                label = "%s, %s samples, %s" % (shape, "{:,}".format(size), platform)
                note = ("healthy loader, 2 workers; first batch plain %.3f s, shim %.3f s; "
                        "first epoch (every 97th sample) plain %.2f s, shim %.2f s; parent "
                        "peak %.0f MB and %.0f MB; records: %s" % (
                            median(p["first_batch"] for p in plain),
                            median(s["first_batch"] for s in shim),
                            median(p["epoch"] for p in plain), median(s["epoch"] for s in shim),
                            median(p["peak"] for p in plain) / 2 ** 20,
                            median(s["peak"] for s in shim) / 2 ** 20,
                            ", ".join(recorded) or "none"))
                if platform == "fork":
                    rows.append(Row(19, "19a %s: extra time to the first batch" % label, 0.05,
                                    "le", "s", extra, note))
                else:
                    rows.append(Row(19, "19b %s: first epoch, shim / plain" % label, 1.05, "le",
                                    "x", ratio, note))
                rows.append(Row(19, "19c %s: parent peak memory, shim / plain" % label, 1.05,
                                "le", "x", memory, "as above"))
    locked = _pair("index", 1_281_167, "macos", reps=reps, plain_lock="hand",
                   shim_lock="guarded")
    rows.append(Row(19, "19d index of 1,281,167 guarded by a lock, as on macOS: first epoch, "
                    "shim (real workers, the lock made anew in each) / the hand fix (the lock "
                    "made in __setstate__, plain spawn)", 1.10, "le", "x",
                    [s["epoch"] / p["epoch"] for s, p in zip(locked["shim"], locked["plain"])],
                    "records: %s" % ", ".join(sorted({c for s in locked["shim"]
                                                       for c in s["records"]})) or "none"))
    # Per iter(): the median of five blocks of 200. The first block alone also
    # holds, where the parent's collector counts stood high at the fork, the
    # worker's first full collection of the heap it inherited (some 90 ms once,
    # its pages copied): where the counts stand at a fork is not a cost per
    # iter(), and plain torch pays it whenever its counts get there.
    pairs = [(_child(TINY, (), True, {})["blocks"], _child(TINY, (), False, {})["blocks"])
             for _ in range(reps)]
    tiny = [(median(shim) - median(plain)) * 1000 for shim, plain in pairs]
    first = [(shim[0] - plain[0]) * 1000 for shim, plain in pairs]
    rows.append(Row(19, "19e a tiny healthy fork loader's later epochs: the shim's cost per "
                    "iter()", 0.2, "le", "ms", tiny, "26 samples, persistent workers, five "
                    "blocks of 200 iterators after 3 warm-up epochs, the median block; the "
                    "first block alone: %s ms (a worker's first full collection, where the "
                    "counts stood at the fork)" % ", ".join("%+.2f" % f for f in first)))
    (RESULTS_DIR / "size_curve.json").write_text(json.dumps(curve))
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    for row in figures():
        print(row)
