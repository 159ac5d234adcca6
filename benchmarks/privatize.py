"""Figure 13: what kernel-level isolation costs each forked worker (issue 26).

At the start of each forked DataLoader worker, before any code of the
user's, the shim gives the worker a description of its own of every regular
file the process holds (``remedies/isolation.py``: ``isolate_in_worker``
reopens ``/proc/self/fd/N`` with the same flags, seeks to the recorded
offset, ``dup2`` under the same number); the parent records the table
(``DescriptorTable.take``, which reads ``/proc/self/fd``) as each iterator
starts its workers. The cost grows with the number of files the process
holds, whoever holds them, so it is measured with N regular files held open
for reading (N = 10 and 100, each at its own offset):

- ``step``: the worker step itself, ``isolate_in_worker(table, 0)``, timed
  inside a child made by ``os.fork()`` (one child per value, the order of
  the sizes alternating); the child then seeks every held descriptor, and
  the parent checks that its own offsets did not move. ``take``: the
  parent's ``DescriptorTable.take()``.
- ``epoch``: the first (and only) epoch of a new fork loader (2 workers,
  batch 16, 64 samples: 4 batches; mostly starting the workers), the shim
  as it is against the shim with DL207 and DL217 disabled (no isolation)
  and against the shim deactivated (``autosafe_torch.deactivate()``), in
  one process, the order rotating. Each sample seeks one of the held
  descriptors to a place of its own; after the epoch the parent reads that
  descriptor's offset back: unchanged where the workers had their own
  descriptions, moved where they shared the parent's.

Usage: python benchmarks/privatize.py  (prints one JSON line; BENCH_QUICK=1
for fewer repetitions); ``make bench`` runs it as figure 13.
"""

import json
import os
import tempfile
import time

QUICK = os.environ.get("BENCH_QUICK", "").strip() not in ("", "0")
SIZES = (10, 100)
HELD = []  # the descriptors the process holds (and the dataset seeks one of)


def hold(n, directory):
    """Open ``n`` more regular files for reading, each at its own offset."""
    while len(HELD) < n:
        i = len(HELD)
        path = os.path.join(directory, "f%03d" % i)
        with open(path, "wb") as f:
            f.write(bytes(4096))
        fd = os.open(path, os.O_RDONLY)
        os.lseek(fd, 7 * i % 4096, os.SEEK_SET)
        HELD.append(fd)


def release(n):
    while len(HELD) > n:
        os.close(HELD.pop())


def _setup():
    os.environ.setdefault("AUTOSAFE_TORCH_QUIET", "1")
    import torch  # noqa: F401

    import autosafe_torch  # noqa: F401  (patches torch now)
    from autosafe_torch import config

    config.CONFIG.quiet = True
    return config


def step_in_child():
    """(parent's take ms, worker step ms) for the files held now."""
    from autosafe_torch.remedies.isolation import DescriptorTable, isolate_in_worker

    t0 = time.perf_counter()
    table = DescriptorTable.take()
    take_ms = (time.perf_counter() - t0) * 1000
    assert len(table.files) >= len(HELD), (len(table.files), len(HELD))
    offsets = [os.lseek(fd, 0, os.SEEK_CUR) for fd in HELD]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker
        os.close(r)
        try:
            t0 = time.perf_counter()
            isolate_in_worker(table, 0)
            ms = (time.perf_counter() - t0) * 1000
            for fd in HELD:  # moves the parent's offsets too, unless private now
                os.lseek(fd, 1, os.SEEK_CUR)
            os.write(w, json.dumps([ms, len(table.files)]).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    ms, files = json.loads(data)
    # the child's seeks left the parent's offsets alone: its descriptions were its own
    assert offsets == [os.lseek(fd, 0, os.SEEK_CUR) for fd in HELD], "shared offsets"
    return take_ms, ms, files


def worker_steps(rounds, directory):
    out = {n: {"take_ms": [], "step_ms": [], "files": 0} for n in SIZES}
    for r in range(rounds):
        for n in (SIZES if r % 2 == 0 else SIZES[::-1]):
            hold(n, directory)
            release(n)
            take_ms, ms, files = step_in_child()
            out[n]["take_ms"].append(take_ms)
            out[n]["step_ms"].append(ms)
            out[n]["files"] = files
    return out


class Seeks:
    """64 samples; each seeks the first held descriptor to a place of its own."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        import torch

        os.lseek(HELD[0], 1000 + i, os.SEEK_SET)
        return torch.full((8,), float(i))


def first_epochs(config, pairs, directory):
    import autosafe_torch
    import torch
    from torch.utils.data import DataLoader

    variants = ("shim", "no isolation", "no shim")

    def state(v):
        if v == "no shim":
            if autosafe_torch.is_active():
                autosafe_torch.deactivate()
            return
        if not autosafe_torch.is_active():
            autosafe_torch.activate("worker")
        config.CONFIG.quiet = True
        config.CONFIG.disabled = (config.parse_disable("DL207,DL217") if v == "no isolation"
                                  else frozenset())

    def epoch():
        loader = DataLoader(Seeks(), batch_size=16, num_workers=2,
                            multiprocessing_context="fork")
        before = os.lseek(HELD[0], 0, os.SEEK_CUR)
        t0 = time.perf_counter()
        seen = sum(1 for _ in loader)
        took = time.perf_counter() - t0
        assert seen == 4
        moved = os.lseek(HELD[0], 0, os.SEEK_CUR) != before
        os.lseek(HELD[0], 0, os.SEEK_SET)
        return took, moved

    out = {n: {v: [] for v in variants} for n in SIZES}
    moved = {v: set() for v in variants}
    for n in SIZES:
        hold(n, directory)
        release(n)
        for v in variants:  # warm up
            state(v)
            epoch()
        for p in range(pairs):
            order = variants[p % 3:] + variants[:p % 3]
            for v in order:
                state(v)
                took, m = epoch()
                out[n][v].append(took * 1000)
                moved[v].add(m)
    state("shim")
    return out, {v: sorted(m) for v, m in moved.items()}


def measure():
    config = _setup()
    with tempfile.TemporaryDirectory() as directory:
        steps = worker_steps(6 if QUICK else 30, directory)
        epochs, moved = first_epochs(config, 3 if QUICK else 20, directory)
        release(0)
    return {"steps": steps, "epochs": epochs, "moved": moved}


def figures():
    """Figure 13 of `make bench` (benchmarks/run.py), measured in a child process."""
    from common import HERE, Row, child_env, json_child, median

    out = json_child([str(HERE / "privatize.py")], child_env({"AUTOSAFE_TORCH_QUIET": "1"}))
    steps = {int(k): v for k, v in out["steps"].items()}
    epochs = {int(k): v for k, v in out["epochs"].items()}
    moved = out["moved"]
    isolated = ("The parent's offset after the epoch: unchanged with the shim (workers had "
                "their own descriptions): %s; moved without isolation (shared): %s" % (
                    "yes" if moved["shim"] == [False] else "NO",
                    "yes" if moved["no isolation"] == [True] else "no"))
    rows = []
    for n, budget in ((10, 1.0), (100, 10.0)):
        s = steps[n]
        rows.append(Row(13, "13%s worker step: own descriptions of %d held files, per worker "
                        "start" % ("a" if n == 10 else "b", n), budget, "le", "ms",
                        s["step_ms"], "isolate_in_worker in a forked child, %d regular files "
                        "in the table (%d held by the benchmark, the rest by the process); "
                        "budget 1 ms per 10 files. The parent's DescriptorTable.take() as "
                        "each iterator starts its workers: %.2f ms (median)." % (
                            s["files"], n, median(s["take_ms"]))))
    for n in SIZES:
        e = epochs[n]
        on, off, bare = (median(e[v]) for v in ("shim", "no isolation", "no shim"))
        rows.append(Row(13, "13%s first epoch of a fork loader (2 workers), %d files held: "
                        "shim / shim without isolation" % ("c" if n == 10 else "d", n), None,
                        None, "x", [a / b for a, b in zip(e["shim"], e["no isolation"])],
                        "4 batches of 16, new workers: mostly their start. First epoch "
                        "(median): shim %.1f ms, shim with DL207/DL217 disabled %.1f ms "
                        "(%+.1f ms), shim deactivated %.1f ms (shim / none %.3f×). %s." % (
                            on, off, on - off, bare, on / bare, isolated)))
    return rows


if __name__ == "__main__":
    print(json.dumps(measure()))
