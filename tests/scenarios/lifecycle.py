"""A training script that ends the way argv[1] says, mid-epoch.

python lifecycle.py END [hand]; END is one of: clean (both epochs, then exit),
exception (the program's own error escapes the loop), exit (``sys.exit(3)``),
os_exit (``os._exit(0)``: no clean-up of any kind), kill_servers (SIGKILL to
every fork server among its children, then on to the end), wait (prints
``READY <pid>`` and sleeps, for the test to send a signal: SIGINT to the group,
SIGTERM, SIGKILL). Its dataset holds an open file and a lock from ``__init__`` (as on
macOS, DL201 reopens the one and makes the other anew in each worker, whose
start comes from the warm server, DL209); ``hand``: the hand fix (both made
in each process), for plain torch. Files go to ``SCENARIO_TMP``.
"""

import os
import signal
import sys
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset

TMP = os.environ.get("SCENARIO_TMP", ".")


class Records(Dataset):
    def __init__(self, path, hand):
        self.path, self.hand = path, hand
        self.fh = None if hand else open(path, "rb")
        self.lock = None if hand else threading.Lock()

    def __len__(self):
        return 400

    def __getitem__(self, i):
        if self.fh is None:
            self.fh, self.lock = open(self.path, "rb"), threading.Lock()
        with self.lock:
            return torch.tensor([float(os.pread(self.fh.fileno(), 1, i % 8)[0])])


def kill_fork_servers():
    """SIGKILL to this process's children that are fork servers (the shim's)."""
    for entry in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % entry) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                server = b"multiprocessing.forkserver" in f.read()
        except (OSError, ValueError):
            continue
        if ppid == os.getpid() and server:
            os.kill(int(entry), signal.SIGKILL)


def main():
    end, hand = sys.argv[1], sys.argv[2:] == ["hand"]
    # Ctrl-C as a terminal's program meets it: a shell that starts the tests in the
    # background (`make heavy &`) leaves SIGINT ignored, and children inherit that.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    path = os.path.join(TMP, "records.bin")
    with open(path, "wb") as f:
        f.write(bytes(range(8)))
    loader = DataLoader(Records(path, hand), batch_size=4, num_workers=2)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _epoch in range(2):
        for n, batch in enumerate(loader):
            optimizer.zero_grad()
            model(batch).sum().backward()
            optimizer.step()
            if n == 3 and end == "exception":
                raise RuntimeError("the program's own error")
            if n == 3 and end == "exit":
                sys.exit(3)
            if n == 3 and end == "os_exit":
                os._exit(0)
            if n == 3 and end == "kill_servers" and _epoch == 0:
                kill_fork_servers()
            if n == 3 and end == "wait":
                print("READY", os.getpid(), flush=True)
                time.sleep(120)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
