"""Run an ordinary framework script, plain or under ``autosafe-torch run``.

The start method is forced from outside the script, as the platform's
default would be (tests/platform_sim/sitecustomize.py: spawn is how macOS
and Windows start workers). Interventions are read back from the JSON-lines
log (AUTOSAFE_TORCH_LOG_FILE) that every shimmed run writes.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from support import PLATFORM_SIM, assert_readable, clean_env, json_log

SCRIPTS = Path(__file__).resolve().parent / "scripts"
START_METHODS = ("fork", "spawn")


class Run:
    def __init__(self, proc, log):
        self.rc = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.records = json_log(log)

    def batches(self, tag="BATCHES"):
        """Checksums the script printed: {rank or None: hex}."""
        out = {}
        for line in self.stdout.splitlines():
            parts = line.split()
            if parts and parts[0] == tag:
                out[int(parts[1]) if len(parts) == 3 else None] = parts[-1]
        return out

    def codes(self, prefix="", without=("DL209",)):
        """The rule codes recorded; a repaired spawn loader's warm start (DL209)
        is left out unless asked for."""
        return sorted({r["code"] for r in self.records
                       if r["code"].startswith(prefix) and r["code"] not in without})

    def __repr__(self):
        return "Run(rc=%s)\n--- stdout\n%s\n--- stderr\n%s\n--- records\n%s" % (
            self.rc, self.stdout[-3000:], self.stderr[-6000:],
            json.dumps(self.records, indent=1)[-3000:])


def script_text(name, replace=()):
    """The script's text, with (old, new) replacements: the ordinary mistake."""
    text = (SCRIPTS / name).read_text()
    for old, new in replace:
        assert old in text, (name, old)
        text = text.replace(old, new)
    return text


def run(tmp_path, name, text, shim, start_method, torchrun=False, timeout=600):
    """Write ``text`` to tmp_path/name and run it; with ``shim``, under
    ``autosafe-torch run`` with a JSON-lines log."""
    tmp_path = Path(tmp_path)
    script = tmp_path / name
    script.write_text(text)
    log = tmp_path / ("log-%s.jsonl" % os.urandom(4).hex()) if shim else None
    env = clean_env({"AUTOSAFE_TEST_START_METHOD": start_method,
                     "PYTHONPATH": str(PLATFORM_SIM), "DATA_DIR": str(tmp_path),
                     "OMP_NUM_THREADS": "1"})
    env.pop("RANK", None)
    # Buffered: one write per printed line, so that two ranks' lines on one
    # pipe do not interleave.
    env.pop("PYTHONUNBUFFERED", None)
    if shim:
        env["AUTOSAFE_TORCH_LOG_FILE"] = str(log)
    program = [str(script)]
    if torchrun:
        program = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                   ] + program
    head = [sys.executable, "-m", "autosafe_torch", "run"] if shim else [sys.executable]
    if shim and start_method == "spawn":
        head += ["--as", "macos"]  # as a Mac user runs it: spawn, and no fork rung
    proc = subprocess.run(head + program, cwd=str(tmp_path), env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert_readable(proc.stderr, env)
    return Run(proc, log)


_plain_runs = {}


def plain_run(tmp_path, name, method, torchrun=False):
    """The unchanged script without autosafe_torch, run once per (script,
    start method) and kept: the reference its shim runs are compared with."""
    key = (name, method)
    if key not in _plain_runs:
        plain = run(tmp_path, name, script_text(name), False, method, torchrun=torchrun)
        assert plain.rc == 0, plain
        _plain_runs[key] = plain
    return _plain_runs[key]


def line_of(text, needle):
    for number, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return number
    raise AssertionError("%r not in script" % needle)


def site_re(script, line, via=None):
    """A call_site of the user's script:line, optionally (via a library frame):
    absolute, or relative to the run's working directory (the script's folder),
    as the stderr line shows it."""
    script = str(script)
    pattern = "(?:%s|%s)" % (re.escape(script), re.escape(os.path.basename(script)))
    pattern += re.escape(":%d" % line)
    if via:
        pattern += re.escape(" (via %s" % via) + r"[^)]*:\d+\)"
    return re.compile("^%s$" % pattern)
