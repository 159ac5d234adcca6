"""Run a real program (tests/realworld/programs/) three ways and read what it printed.

- ``linux``: plain Python, workers forked (Linux's default), no autosafe_torch;
- ``linux-shim``: the same with the ``.pth`` activation (``AUTOSAFE_TORCH=1``);
- ``macos-shim``: the ``.pth`` activation rehearsing macOS (``AUTOSAFE_TORCH_AS=macos``:
  spawn workers, no fork rung in the repair ladder);
- ``macos``: plain Python with spawn workers (tests/platform_sim), no autosafe_torch:
  what a Mac user gets without the shim.

Each program prints ``LOSSES [...]``: its training losses, exact (``repr``).
Shimmed runs write a JSON-lines log (AUTOSAFE_TORCH_LOG_FILE) read back here.
"""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from support import PLATFORM_SIM, assert_readable, clean_env, json_log, logged

PROGRAMS = Path(__file__).resolve().parent / "programs"
WAYS = ("linux", "linux-shim", "macos-shim", "macos")
# The cv2 rules act wherever cv2 is imported on Linux (the thread pool and
# OpenCL off at the import, before any worker forks): they never change data.
CV2_CODES = ("CV401", "CV402")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "TQDM_DISABLE": "1"}


class Run:
    def __init__(self, way, proc, log):
        self.way = way
        self.rc = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.records = json_log(log)

    @property
    def losses(self):
        lines = [line for line in self.stdout.splitlines() if line.startswith("LOSSES ")]
        return ast.literal_eval(lines[-1][len("LOSSES "):]) if lines else None

    def fixes(self, allowed=()):
        """The records of fixes (anything but advice), less the codes in ``allowed``."""
        return [r for r in self.records if r["action"] != "advised" and r["code"] not in allowed]

    @property
    def summary(self):
        lines = [line for line in self.stderr.splitlines()
                 if line.startswith("autosafe_torch: summary:")]
        return lines[-1] if lines else None

    def logged_codes(self):
        return sorted({r.code for r in logged(self.stderr)})

    def __repr__(self):
        return "Run(%s, rc=%s)\n--- stdout\n%s\n--- stderr\n%s\n--- records\n%s" % (
            self.way, self.rc, self.stdout[-3000:], self.stderr[-8000:],
            json.dumps(self.records, indent=1)[-4000:])


def run(tmp_path, program, way, args=(), timeout=400):
    """Run ``programs/<program>`` one ``way`` (see WAYS) with ``args``, in tmp_path."""
    assert way in WAYS, way
    tmp_path = Path(tmp_path)
    shim = way.endswith("-shim")
    log = tmp_path / ("log-%s-%s.jsonl" % (way, os.urandom(4).hex())) if shim else None
    env = clean_env(dict(OFFLINE, PYTHONPATH=str(PLATFORM_SIM), HF_HOME=str(tmp_path / "hf")))
    if way.startswith("linux"):
        env["AUTOSAFE_TEST_START_METHOD"] = "fork"  # Linux's default up to Python 3.13
    elif way == "macos":
        env["AUTOSAFE_TEST_START_METHOD"] = "spawn"  # macOS's default
    if shim:
        env["AUTOSAFE_TORCH"] = "1"
        env["AUTOSAFE_TORCH_LOG_FILE"] = str(log)
        if way == "macos-shim":
            env["AUTOSAFE_TORCH_AS"] = "macos"
    proc = subprocess.run([sys.executable, str(PROGRAMS / program), *map(str, args)],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=timeout)
    if shim:
        assert_readable(proc.stderr, env)
    return Run(way, proc, log)


def check_same_losses(run_, reference):
    """A shimmed run: it ran, and trained with the reference run's losses, exactly;
    no fix of the shim's failed."""
    assert run_.rc == 0, run_
    assert run_.losses == reference.losses, run_
    assert [r for r in run_.records if r["action"] == "failed"] == [], run_
    assert run_.summary is None or "did not hold" not in run_.summary, run_


def check_no_fix(run_, allowed=()):
    """A shimmed run of a program that works as it is: no fix, advice at most,
    in the JSON log, on stderr and in the summary line (``allowed``: codes that
    act in every run and never change data)."""
    assert run_.fixes(allowed) == [], run_
    said = [r for r in logged(run_.stderr) if r.code not in allowed]
    assert all(r.done.startswith("advice") for r in said), run_
    if run_.summary is not None:
        fixed = [c for part in run_.summary.split("; ") if part.startswith(
            ("autosafe_torch: summary: fixed", "fixed"))
                 for c in part.split("fixed ", 1)[1].split(", ")]
        assert all(c.split()[0] in allowed for c in fixed), run_
        assert "did not hold" not in run_.summary and "would fix" not in run_.summary, run_
