"""Figure 21: loaders left early (issue 50): 100 validation loaders, each left after
its first batch, as `break` does.

The dataset holds an open file from ``__init__`` (as on macOS, DL201 reopens it in
each spawned worker, which the warm server forks: DL209). Each run is a process of
its own, the loaders made and left one after another, with a model step on each
first batch; the run's time over all of them is the figure's value:

- 21a: the shim as on macOS / plain torch with the hand fix (the file opened in
  each worker) under spawn, budget <= 1.10x: the shim's loaders end their workers
  as plain torch's do (before issue 50 each early stop waited for a garbage
  collection, about 5 s per worker);
- 21b: the same on Linux (fork), the shim / plain torch (the loader as it is),
  informational.

``BENCH_QUICK=1``: 20 loaders, one run of each; otherwise 100, two runs.
"""

import json
import subprocess
import sys

from common import QUICK, RESULTS_DIR, Row, child_env, log, median

LOADERS = 20 if QUICK else 100
REPS = 1 if QUICK else 2

CHILD = r'''
import json, os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

N, HAND, METHOD = int(sys.argv[1]), sys.argv[2] == "hand", sys.argv[3]

class Held(Dataset):
    def __init__(self, path):
        self.path, self.fh = path, None if HAND else open(path, "rb")
    def __len__(self):
        return 64
    def __getitem__(self, i):
        if self.fh is None:
            self.fh = open(self.path, "rb")
        return torch.tensor([float(os.pread(self.fh.fileno(), 1, i % 8)[0])])

if __name__ == "__main__":
    if METHOD != "default":  # plain torch as a Mac runs it: spawn
        import multiprocessing
        multiprocessing.set_start_method(METHOD)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "early_stop.bin")
    with open(path, "wb") as f:
        f.write(bytes(range(8)))
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    t0 = time.perf_counter()
    for _ in range(N):
        loader = DataLoader(Held(path), batch_size=4, num_workers=2)
        for batch in loader:
            optimizer.zero_grad(); model(batch).sum().backward(); optimizer.step()
            break
    print(json.dumps({"seconds": time.perf_counter() - t0}))
'''


def _run(variant, platform):
    path = RESULTS_DIR / "lifecycle_child.py"
    if not path.exists() or path.read_text() != CHILD:
        path.write_text(CHILD)
    extra = {}
    if variant == "shim":
        extra = {"AUTOSAFE_TORCH": "1", "AUTOSAFE_TORCH_QUIET": "1"}
        if platform == "macos":
            extra["AUTOSAFE_TORCH_AS"] = "macos"
    hand = variant == "plain" and platform == "macos"
    args = [sys.executable, str(path), str(LOADERS), "hand" if hand else "as-is",
            "spawn" if hand else "default"]
    proc = subprocess.run(args, env=child_env(extra), cwd=str(RESULTS_DIR),
                          capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        raise RuntimeError("%s %s failed:\n%s" % (variant, platform, proc.stderr[-2000:]))
    return json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]


def figures():
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    rows = []
    for platform, budget, name in (
            ("macos", 1.10, "21a %d loaders left after their first batch, as on macOS: the "
                            "shim / plain torch's hand fix under spawn"),
            ("linux", None, "21b the same %d loaders, Linux (fork): the shim / plain torch")):
        pairs = []
        for rep in range(REPS):
            order = ("shim", "plain") if rep % 2 == 0 else ("plain", "shim")
            times = {v: _run(v, platform) for v in order}
            pairs.append(times)
        ratio = [p["shim"] / p["plain"] for p in pairs]
        log("  21 %s: shim %.1f s, plain %.1f s" % (
            platform, median(p["shim"] for p in pairs), median(p["plain"] for p in pairs)))
        rows.append(Row(21, name % LOADERS, budget, "le" if budget else None, "x", ratio,
                        "all %d loaders: shim %.1f s, plain %.1f s (medians)" % (
                            LOADERS, median(p["shim"] for p in pairs),
                            median(p["plain"] for p in pairs))))
    return rows
