"""Figures 1 and 2: interpreter start and ``import torch``.

Figure 1 compares interpreters that differ only in our files. Two virtual
environments are made from this interpreter (``venv --without-pip``); the
site-packages of each holds a symbolic link to every entry of this
interpreter's site-packages, except that the "not installed" one leaves out
the files autosafe_torch installed (read from its dist-info RECORD: the
``.pth`` hooks, the start module, the editable path file, the dist-info).
Same binary, same venv start-up, same other ``.pth`` files and packages: the
difference is our files and nothing else. (``python -S``/``-I`` would turn
off all of site, or the user's environment variables, which is not "the
package is not installed"; a fresh venv without the other packages would
differ in many files.)

1a: installed, AUTOSAFE_TORCH unset  vs  not installed.
1b: installed, AUTOSAFE_TORCH=1      vs  installed, unset (no torch import).
2:  ``python -c "import torch"`` with AUTOSAFE_TORCH=1 vs unset (this
    interpreter, package installed): a ratio.
"""

import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

from common import (QUICK, RESULTS_DIR, Row, child_env, log, median, timed_run)


def _our_top_level_entries():
    """Names at the root of site-packages that the installed package owns."""
    from importlib import metadata

    dist = metadata.distribution("autosafe-torch")
    names = set()
    for f in dist.files or ():
        parts = Path(str(f)).parts
        if parts and parts[0] not in ("..", "__pycache__"):
            names.add(parts[0])
    return names


def _site_dirs():
    dirs = []
    for d in site.getsitepackages():
        if os.path.isdir(d) and d not in dirs:
            dirs.append(d)
    return dirs


def make_venvs(base):
    """Two venvs mirroring site-packages: ("installed", "bare")."""
    ours = _our_top_level_entries()
    if not any(n.endswith(".pth") for n in ours):
        raise RuntimeError("autosafe_torch's .pth is not in its RECORD (not pip-installed?)")
    made = {}
    for label in ("installed", "bare"):
        target = base / label
        if target.exists():
            shutil.rmtree(target)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)],
                       check=True, capture_output=True)
        py = target / "bin" / "python"
        purelib = subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True).stdout.strip()
        sp = Path(purelib)
        for d in _site_dirs():
            for name in sorted(os.listdir(d)):
                if name == "__pycache__" or (label == "bare" and name in ours):
                    continue
                link = sp / name
                if not link.exists() and not link.is_symlink():
                    link.symlink_to(os.path.join(d, name))
        made[label] = str(py)
    return made, sorted(ours)


def _importtime(cmd, env):
    """{module: (self_us, cumulative_us)} from one ``-X importtime`` run."""
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    out = {}
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m:
            out[m.group(4)] = (int(m.group(1)), int(m.group(2)))
    return out


OURS = ("autosafe_torch", "_autosafe_torch_start", "wrapt", "cloudpickle")


def _our_import_cost(cmd, env):
    """Sum of the self times (ms) of our modules and our dependencies, and
    the three largest, from ``-X importtime``."""
    times = _importtime(cmd, env)
    mine = {name: s for name, (s, c) in times.items() if name.split(".")[0] in OURS}
    top = sorted(mine.items(), key=lambda kv: -kv[1])[:3]
    return sum(mine.values()) / 1000.0, ", ".join("%s %.1f ms" % (n, s / 1000.0)
                                                   for n, s in top)


def figure1():
    blocks, per = (4, 4) if QUICK else (16, 10)
    base = RESULTS_DIR / "venvs"
    base.mkdir(parents=True, exist_ok=True)
    try:
        venvs, ours = make_venvs(base)
    except Exception as exc:
        why = "could not build the comparison venvs: %s" % exc
        return [Row.not_available(1, "1a start, installed (unset) vs not installed", why,
                                  1.0, "le", "ms"),
                Row.not_available(1, "1b start, active (AUTOSAFE_TORCH=1), no torch", why,
                                  5.0, "le", "ms")]
    unset = child_env()
    active = child_env({"AUTOSAFE_TORCH": "1"})
    variants = {
        "bare": ([venvs["bare"], "-c", "pass"], unset),
        "unset": ([venvs["installed"], "-c", "pass"], unset),
        "active": ([venvs["installed"], "-c", "pass"], active),
    }
    # Warm up: page cache, and the bytecode of our modules.
    for _ in range(3):
        for cmd, env in variants.values():
            t, proc = timed_run(cmd, env)
            if proc.returncode != 0:
                raise RuntimeError("%s failed: %s" % (cmd, proc.stderr[-500:]))
    check = subprocess.run([venvs["installed"], "-c",
                            "import sys; print('autosafe_torch' in sys.modules)"],
                           env=active, capture_output=True, text=True).stdout.strip()
    order = list(variants)
    diff_a, diff_b, base_times = [], [], []
    log("figure 1: %d blocks x %d rounds of 3 interpreters" % (blocks, per))
    for b in range(blocks):
        times = {k: [] for k in variants}
        for i in range(per):
            rot = order[(b + i) % 3:] + order[:(b + i) % 3]   # rotate who goes first
            for k in rot:
                t, _ = timed_run(*variants[k])
                times[k].append(t * 1000.0)
        m = {k: median(v) for k, v in times.items()}
        diff_a.append(m["unset"] - m["bare"])
        diff_b.append(m["active"] - m["unset"])
        base_times.append(m["bare"])
    cost_ms, top = _our_import_cost([venvs["installed"], "-X", "importtime", "-c", "pass"],
                                    active)
    basetxt = "`python -c pass` itself: %.1f ms (median). " % median(base_times)
    note_a = (basetxt + "Two venvs of this interpreter mirroring site-packages by "
              "symlinks; the \"not installed\" one lacks only our files (%s)." %
              ", ".join(ours))
    note_b = ("Same installed venv, AUTOSAFE_TORCH=1 vs unset; the hook imports "
              "autosafe_torch (activated: %s). -X importtime, our modules: %.1f ms "
              "(%s)." % (check, cost_ms, top))
    return [Row(1, "1a start `python -c pass`: installed (unset) − not installed",
                1.0, "le", "ms", diff_a, note_a),
            Row(1, "1b start `python -c pass`: active − installed (unset), no torch",
                5.0, "le", "ms", diff_b, note_b)]


def figure2():
    pairs = 2 if QUICK else 10
    py = sys.executable
    cmd = [py, "-c", "import torch"]
    variants = {"active": child_env({"AUTOSAFE_TORCH": "1", "AUTOSAFE_TORCH_QUIET": "1"}),
                "off": child_env()}
    for env in variants.values():   # warm up, and check that it works
        t, proc = timed_run([py, "-c", "pass"] if QUICK else cmd, env)
        if proc.returncode != 0:
            return [Row.not_available(2, "2 `import torch`: active / not active",
                                      "import torch failed: %s" % proc.stderr[-200:],
                                      1.03, "le", "x")]
    ratios, offs = [], []
    log("figure 2: %d pairs of `import torch`" % pairs)
    for i in range(pairs):
        order = ["active", "off"] if i % 2 == 0 else ["off", "active"]
        t = {}
        for k in order:
            t[k], _ = timed_run(cmd, variants[k])
        ratios.append(t["active"] / t["off"])
        offs.append(t["off"])
    if QUICK:
        cost_ms, top = float("nan"), "not measured in a quick run"
    else:
        cost_ms, top = _our_import_cost([py, "-X", "importtime", "-c", "import torch"],
                                        variants["active"])
    extra = (median(ratios) - 1.0) * median(offs) * 1000.0
    note = ("`import torch` alone: %.2f s (median); the ratio is %+.0f ms. "
            "-X importtime, our modules and dependencies imported when torch is: "
            "%.1f ms (%s)." % (median(offs), extra, cost_ms, top))
    return [Row(2, "2 `import torch`: active / not active", 1.03, "le", "x", ratios, note)]
