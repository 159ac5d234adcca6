"""``make bench``: what autosafe_torch costs and what it saves.

Runs every figure (each in child processes), prints the table, writes
benchmarks/RESULTS.md and benchmarks/results.json, and replaces the
text between ``<!-- bench:start -->`` and ``<!-- bench:end -->`` in
docs/performance.md (when both markers are there; the README links to it). ``BENCH_QUICK=1``: a smoke run (< 90 s) with
few repetitions; its numbers are not worth reporting and it leaves
docs/performance.md alone unless ``--readme`` is given.

    python benchmarks/run.py [--only 1,2,...] [--no-readme | --readme]
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (HERE, QUICK, RESULTS_DIR, ROOT, ChildFailed, Row,  # noqa: E402
                    child_env, json_child, log, median)

START, END = "<!-- bench:start -->", "<!-- bench:end -->"
PERFORMANCE_DOC = "docs/performance.md"  # the file holding the markers, from the root


# ---------------------------------------------------------------- machine

def machine():
    model = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.lower().startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    versions = subprocess.run(
        [sys.executable, "-c", "import json, torch, autosafe_torch\n"
         "try:\n import cv2; cv = cv2.__version__\nexcept Exception: cv = None\n"
         "print(json.dumps([torch.__version__, autosafe_torch.__version__, cv]))"],
        env=child_env(), capture_output=True, text=True)
    try:
        torch_v, ours_v, cv_v = json.loads(versions.stdout.strip().splitlines()[-1])
    except Exception:
        torch_v = ours_v = cv_v = "unknown"
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=str(ROOT),
                         capture_output=True, text=True).stdout.strip() or "?"
    return {"cpu": model, "cores": os.cpu_count(), "usable": usable,
            "python": platform.python_version(), "impl": platform.python_implementation(),
            "os": "%s %s" % (platform.system(), platform.release()),
            "torch": torch_v, "autosafe_torch": ours_v, "opencv": cv_v, "commit": rev,
            "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "load": _load()}


def _load():
    """The 1-minute load average (other work on the machine skews every figure)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


# ---------------------------------------------------------------- figures 3, 5, 6

_INPROC = {}


def inproc_figures(figs):
    """Figures 3, 5, 6 come from one child; it runs once, for all wanted."""
    env = child_env({"AUTOSAFE_TORCH_QUIET": "1"})
    names = {"3": (200.0, "le", "us"), "5": (1.0, "le", "%"), "6": (2.0, "le", "us")}
    if "out" not in _INPROC:
        try:
            want = _INPROC.get("want") or ["3", "5", "6"]
            _INPROC["out"] = json_child([str(HERE / "inproc.py")] + want, env)
        except ChildFailed as exc:
            _INPROC["out"] = exc
    out = _INPROC["out"]
    if isinstance(out, ChildFailed):
        return [Row.not_available(int(f), "%s (in-process figures)" % f, str(out),
                                  *names[f]) for f in figs]
    rows = []
    patched = out["patched_attrs"]
    bad = out["bad_revert"]
    revert_note = (" deactivate() left patched: %s!" % ", ".join(bad)) if bad else ""
    for f in figs:
        budget, kind, unit = names[f]
        for r in out["rows"][f]:
            note = r["note"] + ". Patched vs reverted in one process, blocks alternating."
            note += revert_note
            if f == "6" and not any("autocast" in p for p in patched):
                rows.append(Row.not_available(
                    6, r["name"], "no autocast patch yet (autosafe_torch/patches/amp.py); "
                    "patched attributes: %s" % (", ".join(patched) or "none"),
                    budget, kind, unit))
                continue
            if f == "5":
                it = [p for p in patched if "iter" in p.lower()]
                note += " Iteration patches: %s." % (", ".join(it) or
                                                     "none (only __init__ is wrapped)")
            rows.append(Row(int(f), r["name"], budget, kind, unit, r["values"], note))
    return rows


# ---------------------------------------------------------------- figure 4

def figure4():
    sizes = [1, 10, 100] if QUICK else [1, 10, 100, 1024]
    big = sizes[-1]
    label = "%s" % ("1 GB" if big == 1024 else "%d MB" % big)
    env = child_env({"AUTOSAFE_TORCH_QUIET": "1"})
    rows_na = lambda why: [  # noqa: E731
        Row.not_available(4, "4a probe time, dataset of %s tensors" % label, why, 5.0, "le", "ms"),
        Row.not_available(4, "4b probe time: %s / 1 MB" % label, why, None, None, "x"),
        Row.not_available(4, "4c probe extra memory (tracemalloc peak), %s" % label, why,
                          1.0, "le", "MB"),
        Row.not_available(4, "4d probe extra memory (ru_maxrss growth), %s" % label, why,
                          1.0, "le", "MB")]
    try:
        out = json_child([str(HERE / "probe_cost.py"), "time"] + [str(s) for s in sizes], env)
    except ChildFailed as exc:
        return rows_na(str(exc))
    if "na" in out:
        return rows_na(out["na"])
    times = {float(k): v for k, v in out["times_ms"].items()}
    small = times[float(sizes[0])]
    large = times[float(big)]
    per_size = ", ".join("%g MB %.2f ms" % (s, median(times[float(s)])) for s in sizes)
    rss = []
    for _ in range(1 if QUICK else 3):
        try:
            r = json_child([str(HERE / "probe_cost.py"), "rss", str(big)], env)
            rss.append(r["rss_growth_mb"])
        except ChildFailed as exc:
            log("rss child failed: %s" % exc)
    traced = out["traced_peak_mb"]
    rows = [
        Row(4, "4a probe time, dataset of %s of tensors" % label, 5.0, "le", "ms", large,
            "Medians by size: %s. First call (imports): %.1f ms. Result: %s" % (
                per_size, out["first_call_ms"], out["result"])),
        Row(4, "4b probe time: %s / 1 MB (flat = 1)" % label, None, None, "x",
            [a / b for a, b in zip(large, small)], "per round; sizes alternate"),
        Row(4, "4c probe extra memory (tracemalloc peak), %s" % label, 1.0, "le", "MB",
            [traced[str(float(big))]], "Python allocations during one probe; by size: %s" %
            ", ".join("%s MB %.3f" % (k, v) for k, v in traced.items())),
    ]
    if rss:
        rows.append(Row(4, "4d probe extra memory (ru_maxrss growth), %s" % label, 1.0,
                        "le", "MB", rss, "fresh process per run; dataset built and "
                        "written before the probe"))
    else:
        rows.append(rows_na("the ru_maxrss child failed")[3])
    return rows


# ---------------------------------------------------------------- figure 10 (optional)

def _pipeline(data, dataset, workers, env_extra=None, epochs=2, check=True):
    env = child_env(dict({"AUTOSAFE_TORCH_QUIET": "1"}, **(env_extra or {})))
    args = [str(HERE / "pipeline.py"), "run", str(data), "--dataset", dataset,
            "--workers", str(workers), "--start", "spawn", "--epochs", str(epochs)]
    return json_child(args, env, timeout=300)


def _data_dir():
    n = 160 if QUICK else 1200
    data = RESULTS_DIR / ("images-%d" % n)
    if not (data / "index.npy").exists():
        log("writing %d synthetic JPEG images to %s" % (n, data))
        subprocess.run([sys.executable, str(HERE / "pipeline.py"), "make", str(data), str(n)],
                       check=True, env=child_env())
    return data, n


def _paired_runs(variants, reps):
    """variants: name -> thunk returning the pipeline's JSON; rotate the order."""
    names = list(variants)
    runs = {k: [] for k in names}
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            runs[k].append(variants[k]())
            log("  run %d/%d %s: epochs %s s" % (r + 1, reps, k, ", ".join(
                "%.2f" % e for e in runs[k][-1]["epoch_s"])))
    return runs


def figure10():
    """cv2 rules on vs off (the JPEG pipeline); not in the default run: --only 10."""
    data, n = _data_dir()
    reps = 1 if QUICK else 3
    rows_def = [("10a cv2 rules on vs off (`AUTOSAFE_TORCH_DISABLE=cv2`), 2 spawn workers, "
                 "steady epoch", 2, 1),
                ("10b cv2 rules on vs off, 2 spawn workers, first epoch", 2, 0),
                ("10c cv2 rules on vs off, `num_workers=0` (parent only), steady epoch", 0, 1)]
    rows = []
    for workers in (2, 0):
        defs = [d for d in rows_def if d[1] == workers]
        if QUICK and workers == 0:
            continue
        variants = {
            "on": lambda w=workers: _pipeline(data, "handsafe", w, {"AUTOSAFE_TORCH": "1"}),
            "off": lambda w=workers: _pipeline(data, "handsafe", w, {
                "AUTOSAFE_TORCH": "1", "AUTOSAFE_TORCH_DISABLE": "cv2"}),
        }
        try:
            runs = _paired_runs(variants, reps)
        except ChildFailed as exc:
            rows += [Row.not_available(10, name, str(exc)[-300:], None, None, "x")
                     for name, _, _ in defs]
            continue
        warm = {k: v[0] for k, v in runs.items()}
        codes = [c for c in warm["on"]["interventions"] if c.startswith("CV")]
        if not codes:
            rows += [Row.not_available(10, name, "no CV401/CV402 intervention with "
                                       "autosafe_torch active (autosafe_torch/patches/cv2.py "
                                       "not there yet?)", None, None, "x")
                     for name, _, _ in defs]
            continue
        for name, _, epoch in defs:
            values = [off["epoch_s"][epoch] / on["epoch_s"][epoch]
                      for off, on in zip(runs["off"], runs["on"])]
            if workers == 0:
                rows.append(Row(10, name, None, None, "x", values, (
                    "time off / time on; no workers: the parent keeps its cv2 "
                    "threads (on %s, off %s)." % (
                        warm["on"]["parent_cv2_threads"], warm["off"]["parent_cv2_threads"]))))
                continue
            if epoch == 0:
                rows.append(Row(10, name, None, None, "x", values, "as 10a"))
                continue
            note = ("time off / time on (> 1: the rules make it faster). Hand-safe "
                    "dataset, autosafe_torch active in both. cv2 threads with rules on: "
                    "parent %s, workers %s; off: parent %s, workers %s. OpenCL on/off: "
                    "%s/%s. Interventions: %s." % (
                        warm["on"]["parent_cv2_threads"], warm["on"]["worker_cv2_threads"],
                        warm["off"]["parent_cv2_threads"], warm["off"]["worker_cv2_threads"],
                        warm["on"]["parent_opencl"], warm["off"]["parent_opencl"],
                        ", ".join(codes)))
            rows.append(Row(10, name, None, None, "x", values, note))
    return rows


# ---------------------------------------------------------------- output

FIGURES = {
    "1": lambda: __import__("startup").figure1(),
    "2": lambda: __import__("startup").figure2(),
    "3": lambda: inproc_figures(["3"]),
    "4": figure4,
    "5": lambda: inproc_figures(["5"]),
    "6": lambda: inproc_figures(["6"]),
    "7": lambda: __import__("mission").figure("7"),
    "8": lambda: __import__("mission").figure("8"),
    "9": lambda: __import__("mission").figure("9"),
    "10": figure10,
    # Figures from other modules, one line each: a module of benchmarks/ with a
    # function returning a list of common.Row.
    "11": lambda: __import__("recovery").figures(),
    "12": lambda: __import__("cv2_threads").figures(),
    "13": lambda: __import__("privatize").figures(),
    "14": lambda: __import__("forwarder").figures(),
    "15": lambda: __import__("memmap").figures(),
    "16": lambda: __import__("fork_after_cuda").figures(),
    "17": lambda: __import__("mapped_tensor").figures(),
    "18": lambda: __import__("rebuild_cost").figures(),
    "19": lambda: __import__("size").figures(),
    "20": lambda: __import__("process_state").figures(),
    "21": lambda: __import__("lifecycle").figures(),
}
# Run only when asked (--only): too slow for the default run.
OPTIONAL = ("10", "15", "16", "17")


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(rows):
    lines = ["| figure | budget | measured (median, min – max) | verdict | note |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %s | %s | %s | %s | %s |" % tuple(_cell(x) for x in (
            r.name, r.budget_str(), r.measured_str(), r.verdict(), r.note)))
    return "\n".join(lines)


def header(m, elapsed):
    return ("Machine: %s, %s cores (%s usable), %s. Python %s (%s), torch %s, "
            "autosafe_torch %s (commit %s), OpenCV %s. Run %s, %.0f s; load average "
            "%s at the start, %s at the end%s." % (
                m["cpu"], m["cores"], m["usable"], m["os"], m["python"], m["impl"],
                m["torch"], m["autosafe_torch"], m["commit"], m["opencv"], m["date"],
                elapsed, m.get("load"), _load(),
                ", BENCH_QUICK=1 (smoke run: too few repetitions to report)" if QUICK else ""))


METHOD = """\
How to read it: every figure compares variants run side by side in one run,
alternating (A B A B, with the order rotated), and gives the median of the
per-pair (or per-block) values with their min – max and count. Differences are
"with autosafe_torch − without"; ratios for costs are "with / without"; ratios for
savings (7-10) are "time of the other / time with autosafe_torch" (> 1: faster),
except the budgets on time taken (7c, 9c, 14a: "time with autosafe_torch / time of
the other", ≤ budget).

1. Two venvs of the same interpreter whose site-packages link to every entry of the
   real one; "not installed" lacks only autosafe_torch's files. Wall time of
   `python -c pass`, blocks of 10 rounds, block value = difference of medians.
2. `python -c "import torch"`, AUTOSAFE_TORCH=1 vs unset, one ratio per pair.
3, 5, 6. One process: torch imported, then `import autosafe_torch`; blocks alternate
   between patched and reverted (`deactivate()`; the reverted state is checked
   against a snapshot taken before activation). 3: µs per `DataLoader(...)` call;
   5: per-batch time of whole epochs, as % over unpatched; 6: µs per `with` block.
4. `autosafe_torch.inspection.probe.probe(dataset)` on a dataset holding a uint8 tensor of the
   size shown (plus labels), fresh dataset object per call, sizes alternating;
   memory: tracemalloc peak during one probe, and ru_maxrss growth in a fresh process.
5 is the per-batch cost of the shim on healthy loaders (issue 14's (d)); the worker
   checks at iteration run once per loader state, then a cached key is compared.
7-9. The legacy loop of issue 14 (benchmarks/legacy_loop.py, benchmarks/mission.py):
   a dataset that opens its packed file of 1024 raw 184×184 images in `__init__`;
   per sample three `cv2.GaussianBlur` (11×11) and a resize to 224×224; batch 16,
   64 batches per epoch; a real training step: a small conv net and its SGD
   optimizer built after `DataLoader(...)` (building an optimizer imports
   torch._dynamo, which sets TORCHINDUCTOR_CACHE_DIR in os.environ), forward,
   backward and step() per batch on one intra-op thread (about 25 ms; the hand fix
   with torch's default threads too, in 7a's note: with workers on every core,
   torch's OpenMP threads wait at each barrier for a core a worker holds); 2 workers,
   non-persistent, spawn as on macOS; 2 epochs per run (the first includes
   starting the workers). Eight variants, 3 rounds, the order rotated per round;
   each run is checked for the rung it was meant to take, for who fetched its
   samples (this process, its own workers, or the warm server's children) and for
   its batches (images everywhere; per-worker `torch.randint` draws in every
   2-worker run). 7: the mission's goals (issue 14 (a), issue 27 item 2): steady
   epoch against the hand fix and the hand-safe fork loader, and the whole run
   (process start to exit, workers' start included) against the fork loader's.
   8: each rung, forced by what the dataset needs, not by a switch (issue 14
   (b)). 9: worker start, and what keeping workers across epochs would save
   (issue 14 (c)).
10. (optional, `--only 10`) The JPEG pipeline (benchmarks/pipeline.py) with
   AUTOSAFE_TORCH=1, with and without `AUTOSAFE_TORCH_DISABLE=cv2`.
11. Recovery (benchmarks/recovery.py, issue 13), in one child: (a) 2 persistent fork
   workers, trivial batches, epochs alternating between watched and unwatched
   (DL210-DL216 disabled); (b) the watch's per-batch work timed alone, as % of that
   batch; (c) an epoch with worker 1 SIGKILLed after batch 3 minus the same epoch
   unharmed, pairs alternating.
12. OpenCV's threads (benchmarks/cv2_threads.py).
13. Kernel-level isolation per forked worker (benchmarks/privatize.py, issue 26), in
   one child holding 10 or 100 regular files open: (a, b) the worker step
   `isolate_in_worker` timed inside an `os.fork()` child; (c, d) the first epoch of a
   new 2-worker fork loader, shim vs shim with DL207/DL217 disabled (and
   deactivated, in the note), in one process, the order rotating; the parent's
   offset of a descriptor the workers seek shows the isolation held.
14. A `__getattr__`-forwarding dataset wrapper under spawn as on macOS (benchmarks/
   forwarder.py, issue 27 item 4): the legacy loop's hand-safe dataset inside the
   wrapper, shim with 2 workers vs `num_workers=0`, fresh processes alternating;
   whole run and steady epoch; the shim's samples must come from real worker
   processes (children of the warm server).
19. At the size people train (benchmarks/size.py, issue 41): an ImageNet-style
   index, a captions dict and pre-tokenised lists at 10k, 1.28M and (the index) 10M
   samples, each run a script of its own (spawned workers import its __main__):
   healthy loader of 2 workers, model and optimizer built after it, the first batch
   timed from iter() and a short first epoch; plain torch and the shim alternating,
   under fork, spawn and spawn as on macOS. 19d: the index guarded by a lock, as on
   macOS, against the hand fix (the lock made in __setstate__, plain spawn); 19e: a
   tiny persistent loader's later iter(), 200 of them, shim minus plain.

Child processes run without PYTHONDONTWRITEBYTECODE, so cached bytecode is used as on
a normal installation.
"""


def write_outputs(m, rows, elapsed, readme, out_dir):
    head = header(m, elapsed)
    tbl = table(rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "RESULTS.md").write_text(
        "# Benchmark results\n\nGenerated by `make bench` (benchmarks/run.py); do not "
        "edit by hand.\n\n%s\n\n%s\n\n%s" % (head, tbl, METHOD))
    (out_dir / "results.json").write_text(json.dumps(
        {"machine": m, "quick": QUICK, "elapsed_s": elapsed,
         "rows": [r.as_dict() for r in rows] + []}, indent=1, default=str))
    if readme:
        path = ROOT / PERFORMANCE_DOC
        text = path.read_text()
        lines = text.splitlines(keepends=True)
        starts = [i for i, l in enumerate(lines) if l.strip() == START]
        ends = [i for i, l in enumerate(lines) if l.strip() == END]
        if starts and ends and ends[0] > starts[0]:
            body = "%s\n\n%s\n\nHow each figure is measured: " \
                   "[benchmarks/RESULTS.md](../benchmarks/RESULTS.md).\n" % (head, tbl)
            new = "".join(lines[:starts[0] + 1]) + body + "".join(lines[ends[0]:])
            path.write_text(new)
            log("%s: table written between the bench markers" % PERFORMANCE_DOC)
        else:
            log("%s has no %s ... %s markers: left alone" % (PERFORMANCE_DOC, START, END))
    return head, tbl


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--only", default="", help="comma-separated figures, e.g. 1,4,7")
    p.add_argument("--readme", action="store_true", help="update %s even when quick" % PERFORMANCE_DOC)
    p.add_argument("--no-readme", action="store_true")
    p.add_argument("--out", default=None, help="folder for RESULTS.md and results.json "
                   "(default: benchmarks/, or benchmarks/results/ when BENCH_QUICK=1)")
    a = p.parse_args(argv)
    figs = [f for f in a.only.split(",") if f] or [f for f in FIGURES if f not in OPTIONAL]
    _INPROC["want"] = [f for f in figs if f in ("3", "5", "6")]
    out_dir = Path(a.out) if a.out else (RESULTS_DIR if QUICK else HERE)
    t0 = time.time()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    m = machine()
    rows = []
    for f in figs:
        log("figure %s ..." % f)
        t = time.time()
        try:
            rows += FIGURES[f]()
        except Exception as exc:
            traceback.print_exc()
            rows.append(Row.not_available(int(f), "figure %s" % f, "benchmark error: %r" % exc))
        log("figure %s done in %.0f s" % (f, time.time() - t))
    elapsed = time.time() - t0
    readme = a.readme or (not QUICK and not a.no_readme and not a.only)
    head, tbl = write_outputs(m, rows, elapsed, readme, out_dir)
    log("wrote %s" % (out_dir / "RESULTS.md"))
    print(head)
    print()
    print(tbl)
    return 0


if __name__ == "__main__":
    sys.exit(main())
