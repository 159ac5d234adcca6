"""Figure 14: a dataset wrapper that forwards attributes, under spawn (issue 27 item 4).

A wrapper whose ``__getattr__`` forwards to the dataset it wraps recurses
while unpickling (pickle asks the new, empty instance for
``__setstate__``): each spawned worker dies at start with a RecursionError.
The shim once gave the right batches on emulated workers, but in 31 s
against 9.7 s for ``num_workers=0`` (torch polls worker status every 5 s).
DL201 now pickles such forwarders by their attributes, so the workers stay
real processes (started warm, DL209).

The legacy loop (``legacy_loop.py --dataset handsafe --wrap``: the hand-safe
dataset inside ``Forwarding``, a model and optimizer built after the loader,
forward/backward/step() per batch), two epochs per run, fresh processes,
the order alternating:

- ``shim``: 2 workers, spawn as on macOS (``AUTOSAFE_TORCH_AS=macos``);
- ``zero``: the hand fix ``num_workers=0``, without the shim.

14a: the whole run (process start to exit) shim / zero, budget <= 1.3x;
14b: the steady epoch, shim / zero. Each shim run must show DL201's
attribute-forwarder repair and samples fetched by 2 new worker processes
per epoch, children of the warm server (not emulated workers in this
process); every run the same images.
"""

import subprocess
import sys
import time

from common import HERE, QUICK, Row, child_env, json_child, log, median
from mission import _data

ARGS = ["--dataset", "handsafe", "--wrap"]
VARIANTS = {
    "shim": (ARGS + ["--workers", "2", "--start", "spawn"],
             {"AUTOSAFE_TORCH": "1", "AUTOSAFE_TORCH_AS": "macos"}),
    "zero": (ARGS + ["--workers", "0"], {}),
}


def _run(data, key):
    args, env = VARIANTS[key]
    t0 = time.perf_counter()
    out = json_child([str(HERE / "legacy_loop.py"), "run", str(data)] + args,
                     child_env(dict({"AUTOSAFE_TORCH_QUIET": "1"}, **env)), timeout=300)
    out["process_s"] = time.perf_counter() - t0
    return out


def _unrepaired(data):
    """The wrapped loader under spawn without autosafe_torch: its workers die."""
    proc = subprocess.run([sys.executable, str(HERE / "legacy_loop.py"), "run", str(data),
                           "--epochs", "1"] + ARGS + ["--workers", "2", "--start", "spawn"],
                          env=child_env(), capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and "RecursionError" in proc.stderr:
        return "fails (RecursionError in the spawned workers)"
    return "did NOT fail as expected (rc=%s)" % proc.returncode


def figures():
    data = _data()
    unrepaired = _unrepaired(data)
    runs = {k: [] for k in VARIANTS}
    keys = list(VARIANTS)
    for r in range(1 if QUICK else 3):
        for k in (keys if r % 2 == 0 else keys[::-1]):
            runs[k].append(_run(data, k))
            log("  round %d %s: epochs %s s, process %.2f s" % (
                r + 1, k, ", ".join("%.2f" % e for e in runs[k][-1]["epoch_s"]),
                runs[k][-1]["process_s"]))
    shim, zero = runs["shim"], runs["zero"]
    real = all(r["started_by"] == {"kinds": ["server"], "workers": 4} for r in shim)
    repaired = all(any(i.startswith("DL201:repair") and "forwarder" in i
                       for i in r["interventions"]) for r in shim)
    same = len({r["images"] for v in runs.values() for r in v}) == 1
    by = "; ".join(sorted({"%s by %d processes" % ("+".join(r["started_by"]["kinds"]),
                                                   r["started_by"]["workers"]) for r in shim}))
    note = ("legacy loop, hand-safe dataset inside a __getattr__ forwarder, model + "
            "optimizer built after the loader, forward/backward/step() per batch, 2 "
            "epochs. Whole run (median): shim %.2f s, num_workers=0 %.2f s; steady epoch "
            "%.2f s and %.2f s; first epoch %.2f s and %.2f s. Without autosafe_torch the "
            "spawn run %s. Workers were real processes, 2 new ones per epoch from the warm "
            "server (not emulated): %s (samples fetched: %s); DL201 rebuilt the forwarder "
            "from its attributes: %s (%s); same images in every run: %s. The warm server "
            "was starting just after DataLoader(...) (its imports overlapping the setup, "
            "as for 9c's repaired loader): %s." % (
                median(r["process_s"] for r in shim), median(r["process_s"] for r in zero),
                median(r["epoch_s"][1] for r in shim), median(r["epoch_s"][1] for r in zero),
                median(r["epoch_s"][0] for r in shim), median(r["epoch_s"][0] for r in zero),
                unrepaired, "yes" if real else "NO", by, "yes" if repaired else "NO",
                ", ".join(shim[0]["interventions"]), "yes" if same else "NO",
                "yes" if all(r["server_ahead"] for r in shim) else
                "NO: it started at the first iterator, in the first epoch"))
    return [
        Row(14, "14a spawn (as on macOS) over a `__getattr__`-forwarding dataset wrapper, "
            "whole run: shim (2 real workers) / `num_workers=0`", 1.3, "le", "x",
            [a["process_s"] / b["process_s"] for a, b in zip(shim, zero)], note),
        Row(14, "14b the same, steady epoch: shim / `num_workers=0`", None, None, "x",
            [a["epoch_s"][1] / b["epoch_s"][1] for a, b in zip(shim, zero)], "as 14a"),
    ]
