"""A program's whole life (issue 50): loaders that end early end their workers
as promptly as plain torch's.
"""

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from support import PLATFORM_SIM, SCENARIOS, clean_env, one_of, run_script

# A loader the shim repairs as on macOS (its dataset holds an open file: reopened in
# each spawned worker), left after one batch, as validation loops and `break` do.
# The collector is off: what ends the workers must be the iterator's last reference
# going, as in plain torch, not a collection that happens to come. Each sample says
# which process made it; after the loop the script waits (2 s at most) for those
# processes to be gone, and prints how many are left.
EARLY_STOP = '''
import gc, os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Held(Dataset):
    def __init__(self, path):
        self.fh = open(path, "rb")
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return torch.tensor([float(os.pread(self.fh.fileno(), 1, i % 8)[0]), os.getpid()])

def alive(pids):
    left = set()
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        try:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    continue  # ended, not yet reaped by its parent (a fork server)
        except OSError:
            continue
        left.add(pid)
    return left

if __name__ == "__main__":
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data.bin")
    with open(path, "wb") as f:
        f.write(bytes(range(8)))
    gc.disable()
    loader = DataLoader(Held(path), batch_size=2, num_workers=2)
    worst = 0
    for _ in range(int(sys.argv[1])):
        pids = set()
        for batch in loader:
            pids.update(int(p) for p in batch[:, 1].tolist())
            if len(pids) == 2:
                break
        deadline = time.monotonic() + 2.0
        while alive(pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        worst = max(worst, len(alive(pids)))
    print("LEFT", worst, flush=True)
'''


@pytest.mark.parametrize("shim", [False, True])
def test_a_loader_left_early_ends_its_workers_at_once(tmp_path, shim):
    """Plain torch (under fork: its spawned workers could not receive the file)
    and the shim as on macOS: no worker left once the loop is left."""
    env = {"AUTOSAFE_TORCH_AS": "macos"} if shim else {}
    result = run_script(tmp_path, EARLY_STOP, activation="env" if shim else None,
                        start_method=None if shim else "fork", env=env, args=("3",))
    assert result.rc == 0 and "LEFT 0" in result.stdout, result
    assert not shim or "DL201" in result.stderr, result  # the shim repaired it


# -- every end of a program: nothing of ours left behind ----------------------------

def _group(pgid):
    """The processes of process group ``pgid`` still running (zombies excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry))
    return found


def _ours(folder):
    """What of ours (or of multiprocessing's, for a fork server of ours) is in ``folder``."""
    return sorted(n for n in os.listdir(folder) if n.startswith(("autosafe_torch", "pymp-")))


def _end(tmp_path, end, shim, name):
    """Run the scenario to ``end`` in a session of its own, TMPDIR a folder of its
    own: ``(what is left there once every process of the session is gone, seconds
    the session outlived its main process)``."""
    # short, as a real TMPDIR is: multiprocessing binds sockets under it (AF_UNIX
    # paths stop at 107 bytes; pytest's own folders under xdist are longer)
    folder = pathlib.Path(tempfile.mkdtemp(prefix="lc-%s-" % name, dir="/tmp"))
    _made.append(folder)
    env = clean_env({"SCENARIO_TMP": str(tmp_path), "TMPDIR": str(folder),
                     "PYTHONPATH": str(PLATFORM_SIM)})
    env.update({"AUTOSAFE_TORCH": "1", "AUTOSAFE_TORCH_AS": "macos"} if shim
               else {"AUTOSAFE_TEST_START_METHOD": "spawn"})
    argv = [sys.executable, str(SCENARIOS / "lifecycle.py"),
            "wait" if end.startswith("sig") else end] + ([] if shim else ["hand"])
    proc = subprocess.Popen(argv, cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    if end.startswith("sig"):
        line = proc.stdout.readline()
        assert line.startswith("READY"), (line, proc.stderr.read())
        if end == "sigint-group":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM if end == "sigterm" else signal.SIGKILL)
    proc.communicate(timeout=120)
    ended = time.monotonic()
    while _group(proc.pid) and time.monotonic() < ended + 30:
        time.sleep(0.05)
    outlived = time.monotonic() - ended
    assert not _group(proc.pid), "still running: %s" % _group(proc.pid)
    return _ours(folder), outlived, folder, env


_made = []


@pytest.fixture(autouse=True)
def _remove_folders():
    yield
    while _made:
        shutil.rmtree(_made.pop(), ignore_errors=True)


ENDS = ["clean", "exception", "exit", "os_exit", "kill_servers", "sigint-group", "sigterm",
        "sigkill"]


@pytest.mark.parametrize("end", one_of(ENDS, "sigkill"))
def test_every_end_leaves_nothing_of_ours(tmp_path, end):
    """The same end, plain torch (the hand fix, under spawn) and the shim as on
    macOS (a repaired loader, a warm server): the shim leaves in the temporary
    folder what plain torch leaves there, once the next run has run where
    nothing could remove it in time (SIGKILL, os._exit), and no process of its
    outlives the program by longer than torch's own workers do."""
    plain, plain_outlived, _folder, _env = _end(tmp_path, end, False, "plain")
    left, outlived, folder, env = _end(tmp_path, end, True, "shim")
    if left and end in ("sigkill", "os_exit", "sigterm"):
        # the next run of this user's sweeps what a run that could not clean up left
        subprocess.run([sys.executable, str(SCENARIOS / "lifecycle.py"), "clean"],
                       cwd=str(tmp_path), env=env, capture_output=True, timeout=180,
                       check=True)
        left = _ours(folder)
    assert left == plain == [], (left, plain)
    assert outlived <= plain_outlived + 2.0, (outlived, plain_outlived)
