"""Figures 7, 8 and 9: the legacy loop of issue 14, every way it can run.

One set of runs feeds the three figures: each variant below is a child
process (``legacy_loop.py``, two epochs: the first includes starting the
workers, the second is the steady state), run ``reps`` times in rounds, the
order rotated each round, so that every variant sees the same load.

- 7, what the mission promises: the repaired loader (spawn, as on macOS,
  DL201 + DL209) against the seeds' hand fix ``num_workers=0`` and against
  the hand-safe fork loader, with the same batches.
- 8, each rung of the ladder on the same loop, forced by what the dataset
  needs (no switch): repair under plain spawn (``AUTOSAFE_TORCH_DISABLE=
  DL209``), repair with the warm server, fork (a dataset that holds a
  generator too: nothing makes it pickle, and Linux allows fork), emulated
  workers in process (the generator dataset with ``AUTOSAFE_TORCH_AS=macos``:
  no fork rung). 8d, emulated workers on a thread, went with threaded
  emulation (no rung took it); the other labels stay as they were.
- 9, starting workers: the first epoch under plain spawn and warm; the first
  epoch after the program's own setup (every run builds its model and
  optimizer after ``DataLoader(...)``, as training scripts do; the warm
  server started ahead, at ``DataLoader(...)``) against the hand-safe fork
  loader's; and the steady epoch of warm workers against workers kept
  across epochs (``persistent_workers=True``, which autosafe_torch does not
  apply: see docs/how-it-decides.md).

Every run trains: a small conv net and its optimizer built after the
loader (building the optimizer imports ``torch._dynamo``, which changes
``os.environ``), forward, backward and ``step()`` on every batch. Each run
is also timed from the outside (``process_s``: interpreter start to exit)
for the whole-run figure (7c).
"""

import subprocess
import sys
import time

from common import HERE, QUICK, RESULTS_DIR, ChildFailed, Row, child_env, json_child, log, median

SHIM = {"AUTOSAFE_TORCH": "1"}
LEGACY_SPAWN = ["--dataset", "legacy", "--workers", "2", "--start", "spawn"]
STUCK_SPAWN = ["--dataset", "stuck", "--workers", "2", "--start", "spawn"]
# key: (label, legacy_loop.py arguments, environment, the strategy the log must show)
VARIANTS = {
    "Z": ("hand fix `num_workers=0`", ["--dataset", "legacy", "--workers", "0"], {}, None),
    "Y": ("hand fix `num_workers=0`, torch's default intra-op threads", [
        "--dataset", "legacy", "--workers", "0", "--intra-op", "0"], {}, None),
    "H": ("hand-safe dataset, 2 fork workers", ["--dataset", "handsafe", "--workers", "2",
                                                "--start", "fork"], {}, None),
    "W": ("repair + warm forkserver (the default)", LEGACY_SPAWN, SHIM, "DL209:warm forkserver"),
    "S": ("repair, plain spawn (DL209 disabled)", LEGACY_SPAWN,
          dict(SHIM, AUTOSAFE_TORCH_DISABLE="DL209"), "DL201:repair"),
    "F": ("fork (dataset holds a generator)", STUCK_SPAWN, SHIM, "DL201:start method: fork"),
    "I": ("emulated workers in process (generator, as on macOS)", STUCK_SPAWN,
          dict(SHIM, AUTOSAFE_TORCH_AS="macos"), "DL201:emulated workers (in process)"),
    "P": ("warm, workers kept (persistent_workers=True)", LEGACY_SPAWN + ["--persistent"],
          SHIM, "DL209:warm forkserver"),
}
# who must have fetched the samples in each variant (legacy_loop.started_by):
# this process ("none"), workers it started ("parent"), or a fork server's
# children ("server"). A warm variant whose workers came from the parent fell
# back to plain spawn.
STARTED_BY = {"Z": "none", "Y": "none", "H": "parent", "W": "server", "S": "parent",
              "F": "parent", "I": "none", "P": "server"}
_RUNS = {}


def _data():
    data = RESULTS_DIR / "legacy-images"
    if not (data / "images.bin").exists():
        log("writing the packed image file to %s" % data)
        subprocess.run([sys.executable, str(HERE / "legacy_loop.py"), "make", str(data)],
                       check=True, env=child_env())
    return data


def _run(data, key):
    _label, args, env, _strategy = VARIANTS[key]
    t0 = time.perf_counter()
    out = json_child([str(HERE / "legacy_loop.py"), "run", str(data)] + args,
                     child_env(dict({"AUTOSAFE_TORCH_QUIET": "1"}, **env)), timeout=300)
    out["process_s"] = time.perf_counter() - t0   # the whole run, as the user waits for it
    return out


def _unrepaired(data):
    """The legacy loader under spawn without autosafe_torch must fail."""
    proc = subprocess.run([sys.executable, str(HERE / "legacy_loop.py"), "run", str(data),
                           "--epochs", "1"] + LEGACY_SPAWN, env=child_env(),
                          capture_output=True, text=True, timeout=300)
    err = [l for l in proc.stderr.splitlines() if "Error" in l][-1:] or ["(no error)"]
    if proc.returncode != 0 and "cannot pickle" in proc.stderr:
        return "fails: `%s`" % err[0].strip()
    return "did NOT fail as expected (rc=%s)" % proc.returncode


def runs():
    """{key: [JSON of each run]}, measured once for figures 7-9."""
    if not _RUNS:
        data = _data()
        _RUNS["unrepaired"] = _unrepaired(data)
        keys = list(VARIANTS)
        out = {k: [] for k in keys}
        try:
            for r in range(1 if QUICK else 3):
                for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                    out[k].append(_run(data, k))
                    log("  round %d %s: epochs %s s" % (r + 1, k, ", ".join(
                        "%.2f" % e for e in out[k][-1]["epoch_s"])))
        except ChildFailed as exc:
            _RUNS["failed"] = str(exc)[-400:]
        _RUNS["out"] = out
    return _RUNS


def _epoch(key, epoch):
    return [r["epoch_s"][epoch] for r in _RUNS["out"][key]]


def _ratios(slow, fast, epoch):
    """Time of ``slow`` / time of ``fast``, per round (> 1: ``fast`` is faster)."""
    return [a / b for a, b in zip(_epoch(slow, epoch), _epoch(fast, epoch))]


def _checks():
    """What every run must show: the rung it was meant to take, the same batches."""
    out = _RUNS["out"]
    wrong = ["%s (%s)" % (k, ", ".join(r["interventions"]) or "none")
             for k, (_l, _a, _e, strategy) in VARIANTS.items() if strategy
             for r in out[k] if not any(i.startswith(strategy) for i in r["interventions"])]
    wrong += ["%s (samples fetched by: %s, not %s)" % (k, "+".join(r["started_by"]["kinds"]),
                                                       STARTED_BY[k])
              for k in VARIANTS for r in out[k]
              if r["started_by"]["kinds"] != [STARTED_BY[k]]]
    images = {r["images"] for v in out.values() for r in v}
    reference = out["W"][0]["draws"]
    differ = sorted({k for k, v in out.items() if k not in "ZYP" for r in v
                     if r["draws"] != reference})
    same = ("same images in all %d runs: %s; same per-worker random draws in every "
            "run with 2 new workers per epoch: %s (num_workers=0 draws others: %s)" % (
                sum(map(len, out.values())), "yes" if len(images) == 1 else "NO",
                "yes" if not differ else "NO: " + ", ".join(differ),
                "yes" if all(r["draws"] != reference for r in out["Z"] + out["Y"])
                else "NO"))
    return same, ("; rung NOT taken in: %s" % ", ".join(wrong)) if wrong else ""


def _times(keys, epoch):
    return ", ".join("%s %.2f s" % (VARIANTS[k][0] if len(keys) > 3 else k,
                                     median(_epoch(k, epoch))) for k in keys)


def figure(number):
    state = runs()
    if "failed" in state:
        return [Row.not_available(int(number), "figure %s (legacy loop)" % number,
                                  "a run failed: %s" % state["failed"])]
    same, wrong = _checks()
    return {"7": _figure7, "8": _figure8, "9": _figure9}[number](same, wrong)


def _process(key):
    return [r["process_s"] for r in _RUNS["out"][key]]


def _figure7(same, wrong):
    med = lambda key, field: median(r[field] for r in _RUNS["out"][key])  # noqa: E731
    times = "steady epoch (median): W (repaired) %.2f s, Z (hand fix) %.2f s, H (hand-safe " \
            "fork) %.2f s, of which checking the batches (a numpy sum in the parent) " \
            "%.2f, %.2f and %.2f s" % (tuple(median(_epoch(k, 1)) for k in "WZH") + tuple(
                median(r["check_s"][1] for r in _RUNS["out"][k]) for k in "WZH"))
    whole = [a / b for a, b in zip(_process("W"), _process("H"))]
    return [
        Row(7, "7a repaired (spawn: repair + warm) vs hand fix `num_workers=0`, steady "
            "epoch", 1.2, "ge", "x", _ratios("Z", "W", 1),
            "Legacy loop: packed file opened in __init__, 3 GaussianBlur + resize per "
            "sample, batch 16, 64 batches; a small conv net and its SGD optimizer built "
            "after DataLoader(...), forward/backward/step() per batch on 1 intra-op "
            "thread; spawn as on macOS, 2 workers, non-persistent. %s. The hand fix with "
            "torch's default intra-op threads (Y): steady %.2f s (hand fix / Y %.3f×). "
            "Without autosafe_torch the spawn run %s. %s%s." % (
                times, median(_epoch("Y", 1)), median(_ratios("Z", "Y", 1)),
                _RUNS["unrepaired"], same, wrong)),
        Row(7, "7b repaired vs hand-safe fork loader, steady epoch", 0.97, "ge", "x",
            _ratios("H", "W", 1), times + "."),
        Row(7, "7c whole run (process start to exit, workers' start included): repaired "
            "/ hand-safe fork loader", 1.15, "le", "x", whole,
            "wall time of the whole process (median): repaired %.2f s, hand-safe fork "
            "%.2f s, hand fix %.2f s; of which DataLoader(...) to the end of epoch 2: "
            "%.2f, %.2f and %.2f s, and the setup (model + optimizer, built after the "
            "loader): %.2f, %.2f and %.2f s. The setup set TORCHINDUCTOR_CACHE_DIR in "
            "os.environ in every run: %s; the repaired runs' workers all came from the warm "
            "server: %s." % (
                median(_process("W")), median(_process("H")), median(_process("Z")),
                med("W", "run_s"), med("H", "run_s"), med("Z", "run_s"),
                med("W", "setup_s"), med("H", "setup_s"), med("Z", "setup_s"),
                "yes" if all(r["cache_dir_set_by_setup"] for v in _RUNS["out"].values()
                             for r in v) else "NO",
                "yes" if all(r["started_by"]["kinds"] == ["server"]
                             for r in _RUNS["out"]["W"]) else "NO")),
    ]


def _figure8(same, wrong):
    rows = []
    for key, name in (("S", "8a rung repair (plain spawn)"), ("W", "8b rung repair + warm "
                      "forkserver"), ("F", "8c rung fork"),
                      ("I", "8e rung emulated workers (in process)")):
        rows.append(Row(8, name + ": hand fix / rung, steady epoch", None, None, "x",
                        _ratios("Z", key, 1), "%s: steady %.2f s, first %.2f s; hand fix "
                        "%.2f s. %s" % (VARIANTS[key][0], median(_epoch(key, 1)),
                                       median(_epoch(key, 0)), median(_epoch("Z", 1)),
                                       "" if rows else same + wrong + ".")))
    return rows


def _figure9(same, wrong):
    return [
        Row(9, "9a first epoch incl. starting 2 workers: plain spawn / warm", None, None,
            "x", _ratios("S", "W", 0), "first epoch (median): plain spawn %.2f s, warm "
            "%.2f s, hand-safe fork %.2f s, hand fix %.2f s." % tuple(
                median(_epoch(k, 0)) for k in "SWHZ")),
        Row(9, "9c first epoch after the program's setup (model + optimizer built after "
            "DataLoader(...)): repaired (spawn: repair + warm, server started ahead) / "
            "hand-safe fork loader", 1.15, "le", "x", _ratios("W", "H", 0),
            "first epoch (median), timed from iter(loader) after the setup: repaired "
            "%.2f s, hand-safe fork %.2f s; the setup (median): repaired %.2f s, hand-safe "
            "fork %.2f s. The server starts at DataLoader(...), in the background, so its "
            "imports overlap the setup; the optimizer's torch._dynamo import changes "
            "os.environ after the server started, and each start request carries the "
            "parent's environment of that moment, so the workers still come from the "
            "server (7c). The server was starting just after DataLoader(...) in every "
            "repaired run: %s." % (median(_epoch("W", 0)), median(_epoch("H", 0)),
                                    median(r["setup_s"] for r in _RUNS["out"]["W"]),
                                    median(r["setup_s"] for r in _RUNS["out"]["H"]),
                                    "yes" if all(r["server_ahead"] for r in _RUNS["out"]["W"])
                                    else "NO")),
        Row(9, "9b steady epoch: warm, new workers each epoch / workers kept "
            "(persistent_workers=True, not applied)", None, None, "x", _ratios("W", "P", 1),
            "steady epoch (median): warm %.2f s, kept %.2f s: what reusing workers "
            "would save over warm start. Kept workers' random draws over the 2 epochs "
            "equal those of new workers: %s (kept workers are not re-seeded)." % (
                median(_epoch("W", 1)), median(_epoch("P", 1)),
                "yes" if all(r["draws"] == _RUNS["out"]["W"][0]["draws"]
                             for r in _RUNS["out"]["P"]) else "no")),
    ]
