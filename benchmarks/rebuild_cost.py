"""Figure 18: a dataset built again for spawn workers, against the hand fix (issue 40 item 7).

The dataset's constructor parses a 43 MiB CSV (pandas' python engine: about
1.5 s here) and keeps a safetensors ``safe_open`` handle, which no spawned
worker can receive. 2 workers, 3 epochs, not persistent, shuffled; a model and
optimizer built after the loader, forward/backward/step() per batch.

- ``shim``: the handle opened in ``__init__``, spawn as on macOS
  (``AUTOSAFE_TORCH_AS=macos``): the dataset is built again by its
  constructor's call, once, in a build server started as the loader is made,
  from which every worker of every epoch is forked (DL201, DL209);
- ``hand``: the hand fix, the handle opened lazily in ``__getitem__``, plain
  spawn without the shim (each worker unpickles the parsed table).

18a: the whole run, shim / hand, budget <= 1.05x; 18b: the peak memory of all
the run's processes (the sum of their proportional set sizes, sampled every
50 ms: pages a forked worker shares with its server count once), shim / hand,
budget <= 1.05x. Each shim run must show the build server's record; both
variants give the same batches.

Each run is a script of its own (``run_shim.py``, ``run_hand.py`` beside the data), its
last stdout line JSON.
"""

import json
import os
import subprocess
import sys

import numpy as np
import torch
from torch.utils.data import Dataset

from common import HERE, QUICK, RESULTS_DIR, Row, child_env, log, median

ROWS = 375_000  # 43 MiB of CSV


# ---------------------------------------------------------------- the child

def _write(data):
    import pandas as pd
    from safetensors.torch import save_file

    table = os.path.join(data, "table.csv")
    if not os.path.exists(table):
        os.makedirs(data, exist_ok=True)
        rng = np.random.default_rng(0)
        pd.DataFrame(rng.random((ROWS, 6)), columns=list("abcdef")).to_csv(table + ".tmp",
                                                                           index=False)
        os.replace(table + ".tmp", table)
        save_file({"emb": torch.randn(1000, 16, generator=torch.Generator().manual_seed(0))},
                  os.path.join(data, "emb.safetensors"))


def _pss_of_tree(root):
    """The sum of the proportional set sizes of ``root`` and its descendants (Linux)."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as f:
                    parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    total = 0
    for pid in tree:
        try:
            with open("/proc/%d/smaps_rollup" % pid) as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total


CHILD = '''
import hashlib, os, sys, torch
from torch.utils.data import DataLoader
sys.path.insert(0, {here!r})
from rebuild_cost import Table

if __name__ == "__main__":
    import json, threading, time
    from rebuild_cost import _pss_of_tree
    peak, stop = [0], threading.Event()
    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _pss_of_tree(os.getpid()))
            time.sleep(0.05)
    threading.Thread(target=sample, daemon=True).start()
    t0 = time.perf_counter()
    torch.manual_seed(0)
    dataset = Table({data!r}, lazy={lazy!r})
    loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2)
    model = torch.nn.Sequential(torch.nn.Linear(22, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    h = hashlib.sha256()
    for epoch in range(3):
        for x in loader:
            h.update(x.numpy().tobytes())
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
    wall = time.perf_counter() - t0
    stop.set()
    records = []
    try:
        import autosafe_torch
        records = [(r.code, r.action, r.done) for r in autosafe_torch.interventions()]
    except Exception:
        pass
    print(json.dumps({{"wall": wall, "peak": peak[0], "batches": h.hexdigest(),
                      "records": records}}))
'''


class Table(Dataset):
    """Parses a CSV in __init__ (pandas' python engine) and keeps a safe_open handle
    (``lazy``: the hand fix, the handle opened where it is used)."""

    def __init__(self, root, lazy=False):
        import pandas as pd

        self.frame = pd.read_csv(os.path.join(root, "table.csv"), engine="python")
        self.values = self.frame.to_numpy(np.float32)
        self.path = os.path.join(root, "emb.safetensors")
        self.emb = None if lazy else self.open()

    def open(self):
        from safetensors import safe_open

        return safe_open(self.path, framework="pt")

    def __len__(self):
        return 64 * 40

    def __getitem__(self, i):
        if self.emb is None:
            self.emb = self.open()
        embedding = self.emb.get_slice("emb")[i % 1000]
        return torch.cat([torch.from_numpy(self.values[i * 7 % ROWS]), embedding])


# ---------------------------------------------------------------- the figure

def _run(data, variant):
    lazy = variant == "hand"
    env = child_env({"AUTOSAFE_TORCH": "1", "AUTOSAFE_TORCH_AS": "macos",
                     "AUTOSAFE_TORCH_QUIET": "1"} if variant == "shim" else {})
    script = os.path.join(data, "run_%s.py" % variant)
    with open(script, "w") as f:
        f.write(CHILD.format(here=str(HERE), data=data, lazy=lazy))
    cmd = [sys.executable, script]
    if variant == "hand":
        cmd = [sys.executable, "-c", "import multiprocessing as m, runpy; "
               "m.set_start_method('spawn'); runpy.run_path(%r, run_name='__main__')" % script]
    proc = subprocess.run(cmd, env=env, cwd=data, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError("%s run failed:\n%s" % (variant, proc.stderr[-3000:]))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def figures():
    data = str(RESULTS_DIR / "rebuild_cost")
    _write(data)
    runs = {"shim": [], "hand": []}
    for r in range(1 if QUICK else 3):
        for variant in (("shim", "hand") if r % 2 == 0 else ("hand", "shim")):
            runs[variant].append(_run(data, variant))
            log("  round %d %s: %.2f s, peak %.0f MB" % (
                r + 1, variant, runs[variant][-1]["wall"], runs[variant][-1]["peak"] / 2 ** 20))
    shim, hand = runs["shim"], runs["hand"]
    same = len({r["batches"] for v in runs.values() for r in v}) == 1
    built_once = all(any(code == "DL209" and "built once" in done for code, _a, done in
                         r["records"]) for r in shim)
    note = ("a constructor parsing a 43 MiB CSV (python engine) and keeping a safe_open "
            "handle; 2 workers, 3 epochs, not persistent; model + optimizer built after the "
            "loader, a step per batch. Whole run (median): shim %.2f s, hand fix %.2f s; peak "
            "PSS of all processes: shim %.0f MB, hand fix %.0f MB. The dataset built once, in "
            "a build server every worker was forked from: %s; the same batches: %s." % (
                median(r["wall"] for r in shim), median(r["wall"] for r in hand),
                median(r["peak"] for r in shim) / 2 ** 20,
                median(r["peak"] for r in hand) / 2 ** 20,
                "yes" if built_once else "NO", "yes" if same else "NO"))
    return [
        Row(18, "18a a dataset built again for spawn workers (as on macOS), whole run: "
            "shim / hand fix", 1.05, "le", "x",
            [a["wall"] / b["wall"] for a, b in zip(shim, hand)], note),
        Row(18, "18b the same, peak memory of all processes: shim / hand fix", 1.05, "le", "x",
            [a["peak"] / b["peak"] for a, b in zip(shim, hand)], "as 18a"),
    ]
