"""A program's whole life (issue 50): loaders that end early end their workers
as promptly as plain torch's.
"""

import pytest

from support import run_script

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
