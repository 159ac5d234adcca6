"""A dataset's loggers keep their meaning in spawn/forkserver workers (DL219).

A ``logging.Logger`` pickles by its name, so a spawned worker's is configured
only by its own imports and the lines a dataset logs there are lost (a forked
worker inherits the configuration). While a loader of ours starts its workers
(``carrying``), a logger the dataset holds travels with its configuration and
that of each ancestor its records reach (``Link``); the worker replaces with
that, once, what its imports configured otherwise, and keeps its own where
they configured it alike (transformers does at import), saying which
(``Reports``): DL219's record comes from what the workers said, none where
each had it (promise 1). A handler that cannot be made again (a socket, a
queue, the program's class) is not carried: the loader goes to fork or
emulated workers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any, NamedTuple

from ..inspection.diagnostics import private_file
from ..inspection.holdings import chain, configured, rebuildable
from ..inspection.naming import a_or_an
from . import handlers as _handlers
from .process_state import tell

_carrying = threading.local()


class Reports:
    """Where a loader's workers say, a line each, ``CARRIED`` or ``KEPT``."""

    def __init__(self):
        self.path = None  # made at the first start of the workers (planning makes none)

    def open(self):
        if self.path is None:
            self.path = private_file("loggers")
            weakref.finalize(self, _unlink, self.path)  # at the latest at exit
        return self.path

    def needed(self):
        """Whether a worker needed it, or none said yet (what was sent stands)."""
        said = []
        if self.path is not None:
            with contextlib.suppress(OSError), open(self.path) as f:
                said = f.read().split()
        return CARRIED in said or not said


CARRIED, KEPT = "carried", "kept"


def _unlink(path):
    with contextlib.suppress(OSError):
        os.unlink(path)


@contextlib.contextmanager
def carrying(reports=None):
    """Not the program's own pickles: only while a loader of ours starts its workers."""
    _carrying.on = getattr(_carrying, "on", 0) + 1
    _carrying.path = reports.open() if reports is not None else None
    try:
        yield
    finally:
        _carrying.on -= 1


def uncarried(logger):
    """Why a worker cannot be given ``logger``'s configuration, or None."""
    for link in chain(logger):
        for handler in link.handlers:
            if not rebuildable(handler):
                return "its handler (%s) cannot be made again in a worker" % (
                    a_or_an(type(handler).__name__))
    try:
        ForkingPickler.dumps(_links(logger))
    except Exception as exc:
        return "its configuration does not pickle (%s)" % (
            str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__)
    return None


def reduce_logger(logger):
    """By name, as ever, but configured while ``carrying`` (handlers as recipes)."""
    if not getattr(_carrying, "on", 0) or not configured(logger) or uncarried(logger):
        return logger.__reduce__()
    return configured_in_worker, (_name(logger), _links(logger),
                                  getattr(_carrying, "path", None))


class Link(NamedTuple):
    name: str | None  # None: the root
    level: int
    propagate: bool
    disabled: bool
    filters: list[Any]
    recipes: list[Any]  # each handler, as the recipe that makes it again


def _links(logger):
    return [Link(_name(link), link.level, link.propagate, link.disabled, list(link.filters),
                 [_handlers.reduce_handler(h)[1] for h in link.handlers])
            for link in chain(logger)]


def _name(logger):
    return None if logger is logging.root else logger.name


_decided: set[str | None] = set()  # in a worker: the loggers configured as the training process's


def configured_in_worker(name, links, report=None):
    """In a worker: ``name``'s logger, its chain configured as the training process's."""
    replaced = False
    for want in links:
        if want.name in _decided:
            continue
        _decided.add(want.name)
        link = logging.getLogger(want.name)  # None: the root
        if _configured_alike(link, want):
            continue  # as plain spawn: the worker's own
        replaced = True
        for own in list(link.handlers):  # the worker's import configured these
            link.removeHandler(own)
            with contextlib.suppress(Exception):
                own.close()
        for recipe in want.recipes:
            link.addHandler(_handlers.made_again(*recipe))
        link.setLevel(want.level)
        link.propagate, link.disabled = want.propagate, want.disabled
        link.filters = list(want.filters)
    tell(report, (CARRIED if replaced else KEPT) + "\n")
    return logging.getLogger(name)


def _configured_alike(link, want: Link):
    if (link.level, link.propagate, link.disabled) != (want.level, want.propagate, want.disabled):
        return False
    if not _alike(list(link.filters), want.filters) or len(link.handlers) != len(want.recipes):
        return False
    return all(rebuildable(own) and _alike(_handlers.reduce_handler(own)[1], recipe)
               for own, recipe in zip(link.handlers, want.recipes))


_PLAIN = (str, bytes, int, float, bool, type(None))


def _alike(a, b, depth=0):
    """Equal in value, objects by class and attributes (a formatter made again is
    another object), functions and classes by identity; too deep: not alike."""
    if type(a) is not type(b) or depth > 6:
        return False
    if isinstance(a, _PLAIN):
        return a == b
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_alike(a[k], b[k], depth + 1) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_alike(x, y, depth + 1) for x, y in zip(a, b))
    if isinstance(a, type) or callable(a):
        return a is b
    own, other = getattr(a, "__dict__", None), getattr(b, "__dict__", None)
    return isinstance(own, dict) and isinstance(other, dict) and _alike(own, other, depth + 1)


def reducers(loggers):
    classes = [type(logger) for logger in loggers] + [logging.Logger, logging.RootLogger]
    return dict.fromkeys(classes, reduce_logger)
