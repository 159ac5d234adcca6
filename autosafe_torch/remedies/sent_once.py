"""The dataset pickled once, and those bytes sent to every spawned worker.

torch pickles the dataset at each worker's start (spawn, forkserver): for an
ImageNet index of 1.28M ``(path, class)`` tuples, some 0.6 s a worker, every
epoch of a non-persistent loader. Where the pickle can go as it is to every
worker (``inventory.sent_as_is``: nothing pickled per child or made again by
a repair; and no other part refers to the dataset, whose objects would
otherwise be two in the worker), it is made once per iterator (or the plan's
probe hands its own over: ``keep``) and each worker gets ``pickle.loads`` of
those bytes. Only in fix mode, for that dataset object alone.
"""

from __future__ import annotations

import contextlib
import pickle
from typing import Any

from ..inspection import probe as probes
from ..inspection.parts import PARTS
from ..mp_private import extra_reducers
from ..loaderstate import state_of
from .pickling import WorkerPickler, install, installed

# id(dataset) -> (dataset, bytes), while its loader's workers start
_offered: dict[int, tuple[Any, bytes]] = {}


def keep(loader, dataset, pickled):
    """The plan's pickle of ``dataset``, kept on ``loader`` for ``offering``."""
    state_of(loader).pickled = (dataset, pickled)


@contextlib.contextmanager
def offering(loader):
    """While ``loader``'s workers start: its dataset goes to each as one pickle,
    where it may."""
    state = state_of(loader)
    kept, state.pickled = state.pickled, None
    dataset = loader.dataset
    pickled = kept[1] if kept is not None and kept[0] is dataset else None
    if pickled is None:
        pickled = _pickled(loader)
    cls = type(dataset)
    if pickled is None or cls in extra_reducers() or installed(cls) is not None:
        yield
        return
    _offered[id(dataset)] = (dataset, pickled)
    install({cls: _reduce})
    try:
        yield
    finally:
        _offered.pop(id(dataset), None)
        if installed(cls) is _reduce:
            WorkerPickler.ours.pop(cls, None)


def _pickled(loader):
    dataset = loader.dataset
    if dataset is None:
        return None
    for name in PARTS:
        part = getattr(loader, name, None)
        if name != "dataset" and part is not None and probes.probe(part, name,
                                                                    watch=dataset).meets:
            return None  # it refers to the dataset: one pickle for both, as torch makes it
    return probes.probe(dataset, "dataset", keep=True).pickled


def _reduce(obj):
    found = _offered.get(id(obj))
    if found is None or found[0] is not obj:
        return obj.__reduce_ex__(pickle.DEFAULT_PROTOCOL)  # as pickle's default would
    return pickle.loads, (found[1],)
