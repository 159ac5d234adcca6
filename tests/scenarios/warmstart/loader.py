"""A loader over two epochs, reporting everything its workers can observe.

Run: python loader.py KIND [--env-change] [--die] [--ahead]. KIND ``legacy`` holds an
open file (it does not pickle: DL201 repairs it under spawn); ``healthy``
opens its file per fetch; ``forwarder`` wraps the healthy one in a class
that forwards attributes with ``__getattr__`` (it pickles, but a worker's
unpickling recurses: DL201 rebuilds it from its attributes). Each sample
carries its bytes, draws from torch's, Python's and numpy's global
generators, the worker's info and seed, the dataset copy's fetch count, the
worker's process name, the modules it had, and an environment variable.
Prints:

- ``BATCHES <sha256>`` over every sample of both epochs, in order;
- ``STARTED_BY parent|server``: whether the workers' parent process is this
  one (spawn) or a fork server;
- the import count of this file is in SCENARIO_TMP/imports.log (its top
  level appends one line each time it is imported: here, and in every
  worker that imports it as spawn does).

As a training script does, it builds a model and its optimizer after the
loader, and runs forward, backward and ``step()`` on every batch: building
the optimizer imports ``torch._dynamo``, which sets TORCHINDUCTOR_CACHE_DIR
in ``os.environ`` after the loader (and the warm server) started (on torch
2.0, which does not, the script sets it there itself); it prints
``SETUP_CHANGED_ENV True`` when it did.

``--ahead`` prints ``AHEAD <starting> <running>`` just after the loader is
built: whether the warm server (DL209) is being started ahead, in a thread
of its own, and whether it then runs before the first iterator.
``--env-change`` sets SCENARIO_EPOCH before each epoch (the workers read
it); ``--die`` prints ``WORKERS <pids>`` mid-epoch and kills this process
with SIGKILL.
"""

import hashlib
import multiprocessing
import os
import random
import signal
import sys
import tempfile

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

TMP = os.environ["SCENARIO_TMP"]
DATA = os.path.join(TMP, "warm.bin")

with open(os.path.join(TMP, "imports.log"), "a") as _log:
    _log.write("%d %s\n" % (os.getpid(), __name__))


class Samples(Dataset):
    def __init__(self, hold_file):
        self.f = open(DATA, "rb") if hold_file else None
        self.fetches = 0

    def __len__(self):
        return 24

    def __getitem__(self, i):
        self.fetches += 1
        f = self.f or open(DATA, "rb")
        f.seek(i * 4)
        raw = f.read(4)
        if self.f is None:
            f.close()
        info = get_worker_info()
        return {"data": torch.tensor(list(raw)), "torch": torch.randint(1 << 30, ()).item(),
                "random": random.random(), "numpy": float(np.random.rand()),
                "worker": (info.id, info.num_workers, info.seed) if info else None,
                "fetches": self.fetches, "name": multiprocessing.current_process().name,
                "modules": "__mp_main__" in sys.modules and "torch" in sys.modules,
                "epoch": os.environ.get("SCENARIO_EPOCH", ""),
                "by": "parent" if os.getppid() == int(os.environ["SCENARIO_PARENT"])
                else "server", "pid": os.getpid()}


class Forwarding(Dataset):
    """A wrapper as libraries write them: unknown attributes go to the inner dataset."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        return self.inner[i]


def report_ahead():
    """``AHEAD <starting> <running>``, just after DataLoader(...): whether a thread
    of autosafe_torch is starting the warm server now, and (after waiting for
    it) whether the server runs, before the first iterator."""
    import threading

    from autosafe_torch.remedies import warmstart

    starting = [t for t in threading.enumerate() if t.name == "autosafe_torch warm start"]
    for t in starting:
        t.join(60)
    server = warmstart._state["server"]
    running = server is not None and server._forkserver_pid is not None
    print("AHEAD", bool(starting), running, flush=True)


def main(argv):
    kind = argv[0]
    with open(DATA, "wb") as f:
        f.write(bytes(range(256)) * 4)
    os.environ["SCENARIO_PARENT"] = str(os.getpid())
    torch.manual_seed(0)
    dataset = Samples(kind == "legacy")
    if kind == "forwarder":
        dataset = Forwarding(dataset)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, shuffle=True)
    if "--ahead" in argv:
        report_ahead()
    had_cache_dir = "TORCHINDUCTOR_CACHE_DIR" in os.environ
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if not had_cache_dir and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        # torch 2.0's optimizer imports no torch._dynamo: the setup changes
        # os.environ as a later torch's does, so that every torch runs the case
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(),
                                                             "scenario_inductor")
    print("SETUP_CHANGED_ENV", not had_cache_dir and "TORCHINDUCTOR_CACHE_DIR" in os.environ,
          flush=True)
    h, started_by = hashlib.sha256(), set()
    for epoch in range(2):
        if "--env-change" in argv:
            os.environ["SCENARIO_EPOCH"] = str(epoch)
        for batch in loader:
            started_by.update(batch.pop("by"))
            pids = batch.pop("pid")
            if "--die" in argv:
                print("WORKERS", " ".join(str(int(p)) for p in set(pids.tolist())), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            optimizer.zero_grad()
            model(batch["data"].float()).pow(2).mean().backward()
            optimizer.step()
            for key in sorted(batch):
                h.update(key.encode() + repr(batch[key].tolist() if torch.is_tensor(batch[key])
                                             else batch[key]).encode())
    print("STARTED_BY", " ".join(sorted(started_by)), flush=True)
    print("BATCHES", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
