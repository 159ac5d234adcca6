"""Memory maps travel to spawn/forkserver workers by reference (DL218).

A loader whose workers receive the dataset by pickling (spawn, forkserver,
the warm server of DL209; not fork, whose workers inherit the map) copies
every ``numpy.memmap`` it holds into each worker start: the whole file is
read, pickled and unpickled per worker and per epoch, and every worker
holds a private copy. Nothing fails, it is only slow and large, and the
worker gets exactly what the map showed; DL218 gives it the same array
mapped again from the file (``remedies/memmaps.py``: exact or nothing, a
map that cannot be reproduced exactly is pickled as before).

It runs after the ladder and the warm start (``RULE_MODULES``): it sees the
start method they chose, and acts on nothing they sent to fork or to
emulated workers.
"""

import os
import sys

from . import number_of, rule
from .workers import GROUP, _spawning_workers, held_in_parts, pickling_plan


@rule("DL218", "memmap-by-reference", GROUP,
      summary=("a numpy memmap in the dataset of spawn/forkserver workers: sent as file, "
               "offset, shape, dtype and order, and mapped again copy-on-write in each "
               "worker (what pickling gives: a writable private array of the same "
               "bytes), not copied into every worker start; a mode='c' map, a strided "
               "view, a deleted file: pickled as before. Assumes the file does not "
               "change while the workers run; a worker that finds it changed or gone "
               "fails loudly"),
      prevents=("no error: each worker start pickles the whole mapped file (a 300 MiB "
                "memmap under spawn with 2 workers: 1.4 GiB and 15-16 s where mapping it "
                "in each worker takes 0.5 GiB and 13.6 s)"),
      fix=("open the np.memmap lazily in each worker (in __getitem__ or worker_init_fn), "
           "keeping only its path on the dataset"),
      example=(("class Images(Dataset):\n"
                "    def __init__(self, path):\n"
                "        # pickled whole into every spawn worker start\n"
                "        self.images = np.memmap(path, np.uint8, 'r', shape=(N, 3, 224, "
                "224))\n"
                "    def __getitem__(self, i):\n"
                "        return torch.from_numpy(self.images[i].copy())"),
               ("class Images(Dataset):\n"
                "    def __init__(self, path):\n"
                "        self.path, self.images = path, None\n"
                "    def __getitem__(self, i):\n"
                "        if self.images is None:   # mapped in each worker\n"
                "            self.images = np.memmap(self.path, np.uint8, 'r',\n"
                "                                    shape=(N, 3, 224, 224))\n"
                "        return torch.from_numpy(self.images[i].copy())")),
      versions=("every supported torch; spawn workers (macOS, Windows) and forkserver "
                "workers (Linux from Python 3.14). Maps are found through "
                "/proc/self/maps: on macOS and Windows the memmap is pickled as before"),
      at="dataloader.iter")
def memmap_by_reference(args, ctx):
    numpy = sys.modules.get("numpy")
    if numpy is None or not _spawning_workers(args, ctx) \
            or any(f.state.get("emulated_workers") for f in ctx.findings) \
            or pickling_plan(args, ctx).failures:
        return None
    sent, kept = _memmaps(args, numpy)
    if not sent:
        return None
    from ..remedies import memmaps

    workers = number_of(args["num_workers"], "worker")
    named = ["%s (a numpy memmap of %s, %s)" % (
        path, _file_name(ref.path), memmaps.size_text(arr.nbytes)) for path, arr, ref in sent]
    shown = ", ".join(named[:3]) + (" and %d more" % (len(named) - 3) if len(named) > 3 else "")
    why = "pickling copies each memmap into every worker start; the worker maps the file " \
          "again instead (copy-on-write, as writable and private as the copy)"
    if kept:
        why += "; pickled as before: %s" % "; ".join("%s (%s)" % item for item in kept)
    return memmap_by_reference.rule.finding(
        {"memmaps": [path for path, _arr, _ref in sent]}, why=why, strategy="by reference",
        remedies=[lambda args: memmaps.install_reducers()],
        done="%s mapped again in each of %s instead of copied into it" % (shown, workers))


def _memmaps(args, numpy):
    """``(sent, kept)``: ``(path, array, Reference)`` for each memmap of the
    parts that can go by reference, ``(path, why not)`` for the others."""
    from ..remedies import memmaps

    sent, kept, mappings = [], [], ()
    # The type the reducer is registered for: a subclass pickles as it always did.
    for here, obj in held_in_parts(args, lambda obj: type(obj) is numpy.memmap):
        if mappings == ():
            mappings = memmaps.file_mappings()  # None: no /proc/self/maps
        ref, why = memmaps.reference(obj, mappings)
        if ref is None:
            kept.append((here, why))
        else:
            sent.append((here, obj, ref))
    return sent, kept


def _file_name(path):
    return os.path.basename(path)
