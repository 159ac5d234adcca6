"""Recovery (issue 13): what watching costs a healthy loader, and what one
killed worker costs.

- ``healthy_overhead_pct``: trivial batches (16x8 floats) through 2
  persistent fork workers, watched (the shim as it is) against not watched
  (DL210-DL213 disabled), epochs alternating in one process; the median of
  the paired ratios. Dominated by inter-process transfer, so noisy on a
  shared machine: see ``bookkeeping_us_per_batch`` for the cost itself.
- ``bookkeeping_us_per_batch``: the work the watch adds to each batch (the
  proxy's ``__next__``, the recorder's ``__next__``, two clock reads, the
  limit and the observation), timed on its own, and as a percentage of the
  unwatched per-batch time of the loader above.
- ``recover_killed_worker_s``: an epoch of 48 batches from 2 fork workers
  in which worker 1 is SIGKILLed after batch 3, minus the same epoch
  unharmed (fresh workers each epoch, pairs alternating): detection,
  shutdown, new workers, and the replay of the batches delivered.

Usage: python benchmarks/recovery.py  (prints one JSON dict of the values;
BENCH_QUICK=1 for fewer repetitions); ``make bench`` runs it as figure 11.
"""

import json
import os
import signal
import statistics
import sys
import time

QUICK = os.environ.get("BENCH_QUICK", "").strip() not in ("", "0")


def _setup():
    os.environ.setdefault("AUTOSAFE_TORCH_QUIET", "1")
    import torch  # noqa: F401

    import autosafe_torch  # noqa: F401  (patches torch now)
    from autosafe_torch import config

    config.CONFIG.quiet = True
    return config


def _watching(config, on):
    from autosafe_torch.rules.recovery import KINDS  # every failure recovery watches

    config.CONFIG.disabled = frozenset() if on else config.parse_disable(",".join(KINDS))


def healthy_overhead(config, pairs):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    n = 2048
    ds = TensorDataset(torch.arange(n * 8, dtype=torch.float32).view(n, 8), torch.arange(n))
    loaders = {}
    for on in (True, False):
        _watching(config, on)
        loaders[on] = DataLoader(ds, batch_size=16, num_workers=2, persistent_workers=True,
                                 multiprocessing_context="fork")
        for _ in loaders[on]:  # the first epoch starts the workers: not timed
            pass
    _watching(config, True)
    from autosafe_torch.recovery import RecoveringIter

    assert isinstance(loaders[True]._iterator, RecoveringIter)
    assert not isinstance(loaders[False]._iterator, RecoveringIter)

    def epoch(on):
        nb, t0 = 0, time.perf_counter()
        for _ in loaders[on]:
            nb += 1
        return (time.perf_counter() - t0) / nb

    ratios, base = [], []
    for i in range(pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        times = {on: epoch(on) for on in order}
        ratios.append(times[True] / times[False])
        base.append(times[False])
    loaders.clear()
    return statistics.median(base) * 1e6, ratios


def bookkeeping_us(repeats, n=200000):
    """The per-batch work of the watch, without the inter-process transfer:
    the real ``RecoveringIter`` and ``Recorder`` around a stand-in for torch's
    iterator that does what the watched ``_get_data`` adds (the limit, two
    clock reads, the observation), against the bare stand-in."""
    from types import SimpleNamespace

    from autosafe_torch.recovery import RecoveringIter
    from autosafe_torch.recovery.rungs import LoaderLadder
    from autosafe_torch.recovery.watch import Watch
    from autosafe_torch.torch_private import Recorder

    class Bare:
        def __init__(self):
            self.sampler = iter(range(n))

        def __iter__(self):
            return self

        def __next__(self):
            return next(self.sampler)

    class Watched(Bare):
        def __init__(self, watch):
            self.sampler = Recorder(iter(range(n)))
            self.watch = watch

        def __next__(self):
            index = next(self.sampler)
            watch = self.watch
            watch.limit()
            start = time.monotonic()
            watch.observed(time.monotonic() - start)
            return index

    def per_item(it):
        t0 = time.perf_counter()
        for _ in range(n):
            next(it)
        return (time.perf_counter() - t0) / n

    loader = SimpleNamespace(persistent_workers=False)
    values = []
    for _ in range(repeats):
        watch = Watch(frozenset({"hung", "died"}), 60.0, 0)
        watched = RecoveringIter(Watched(watch), loader, LoaderLadder(), watch)
        values.append((per_item(watched) - per_item(Bare())) * 1e6)
    return values


def recover_killed_worker(pairs):
    import torch
    from torch.utils.data import DataLoader, Dataset, get_worker_info

    class Pids(Dataset):
        def __len__(self):
            return 48 * 16

        def __getitem__(self, i):
            return torch.full((8,), float(i)), get_worker_info().id, os.getpid()

    def epoch(kill):
        # A new loader each time: a loader whose restart rung failed twice
        # would rightly go to emulated workers.
        loader = DataLoader(Pids(), batch_size=16, num_workers=2, multiprocessing_context="fork")
        t0 = time.perf_counter()
        seen = 0
        for number, (_x, ids, pids) in enumerate(loader):
            seen += 1
            if kill and number == 3:
                victim = int(pids[0])
                assert victim != os.getpid()
                os.kill(victim, signal.SIGKILL)
        assert seen == 48
        return time.perf_counter() - t0

    epoch(False)
    values = []
    for i in range(pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        times = {kill: epoch(kill) for kill in order}
        values.append(times[True] - times[False])
    return values


def measure():
    """Every value of figure 11, as lists (one per pair or repetition)."""
    config = _setup()
    base_us, ratios = healthy_overhead(config, 4 if QUICK else 12)
    book_values = bookkeeping_us(3 if QUICK else 5)
    recover_values = recover_killed_worker(3 if QUICK else 5)
    return {"start_method": "fork",
            "healthy_overhead_pct": [(r - 1) * 100 for r in ratios],
            "healthy_us_per_batch_unwatched": base_us,
            "bookkeeping_us_per_batch": book_values,
            "recover_killed_worker_s": recover_values}


def figures():
    """Figure 11 of `make bench` (benchmarks/run.py), measured in a child process:
    the watch on a healthy loader and the time to recover from one killed worker."""
    from common import HERE, Row, child_env, json_child

    out = json_child([str(HERE / "recovery.py")], child_env({"AUTOSAFE_TORCH_QUIET": "1"}))
    base = out["healthy_us_per_batch_unwatched"]
    book = out["bookkeeping_us_per_batch"]
    return [
        Row(11, "11a healthy loader watched vs not (DL210-DL216 on/off), per batch", 1.0,
            "le", "%", out["healthy_overhead_pct"],
            note="2 persistent fork workers, trivial batches (16×8 floats), %.1f µs per batch "
            "unwatched: dominated by inter-process transfer, so mostly noise on a shared "
            "machine; 11b is the watch alone" % base),
        Row(11, "11b the watch's bookkeeping per batch, as % of that trivial batch", 1.0, "le",
            "%", [v / base * 100 for v in book],
            note="the proxy's and the recorder's __next__, two clock reads, the limit and the "
            "observation, timed on their own: %s µs per batch" % ", ".join(
                "%.2f" % v for v in book)),
        Row(11, "11c time to recover from one killed worker (SIGKILL mid-epoch)", None, None,
            "s", out["recover_killed_worker_s"],
            note="the extra time of an epoch of 48 batches, 2 fork workers, worker 1 killed "
            "after batch 3: detection, new workers, replay of the 4 batches delivered"),
    ]


if __name__ == "__main__":
    print(json.dumps(measure()))
