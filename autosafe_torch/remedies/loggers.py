"""A dataset's loggers keep their meaning in spawn/forkserver workers (DL219).

A ``logging.Logger`` pickles by its name: a spawned worker gets its own
logger of that name, configured only by what the worker's own imports did
(usually nothing), so the lines a dataset logs from a worker are lost where a
forked worker writes them (it inherits the configuration). Under the shim,
while a repaired or checked loader starts its workers (``carrying``), a
logger the dataset holds travels with its configuration: for it and each
ancestor its records reach (up to the root, or the first that does not
propagate), the level, ``propagate``, ``disabled``, the filters and the
handlers, each handler made again in the worker (``handlers.py``: a file
opened again for appending, a stream on the worker's stdout or stderr) with
its level, formatter and filters. In the worker that configuration replaces
(never adds to) what the worker's own import of the script configured, once
per worker: a line is written once, where the training process writes it.

A handler that cannot be made again (a socket, a queue, a class of the
program's) cannot be carried: the plan says so, and the loader goes where
its loggers need nothing carried (fork, or emulated workers).
"""

from __future__ import annotations

import logging
import threading

from . import handlers as _handlers

_carrying = threading.local()


class carrying:
    """While a loader of ours starts its workers: its loggers travel
    configured (the reducer acts for these pickles only, not for the
    program's own processes)."""

    def __enter__(self):
        _carrying.on = getattr(_carrying, "on", 0) + 1
        return self

    def __exit__(self, *exc):
        _carrying.on -= 1


def chain(logger):
    """The loggers whose configuration ``logger``'s records meet, from it up:
    itself, then each parent while the one below propagates."""
    found = []
    current = logger
    while current is not None:
        found.append(current)
        if not current.propagate:
            break
        current = current.parent
    return found


def configured(logger):
    """Whether ``logger``'s records meet a configuration that a spawned worker
    would not have: a handler, a level, a filter, ``propagate`` off or
    ``disabled`` on anywhere along its chain (the root's default level,
    WARNING, is what a new process has too)."""
    for link in chain(logger):
        if link.handlers or link.filters or link.disabled or not link.propagate:
            return True
        if link.level != (logging.WARNING if link is logging.root else logging.NOTSET):
            return True
    return False


def uncarried(logger):
    """The first handler along ``logger``'s chain that a worker cannot make
    again, or None."""
    for link in chain(logger):
        for handler in link.handlers:
            if not _handlers.rebuildable(handler):
                return handler
    return None


def handler_classes(loggers):
    return {type(h) for logger in loggers for link in chain(logger) for h in link.handlers}


def reduce_logger(logger):
    """ForkingPickler's reducer for loggers: by name, as ever, but while a
    loader of ours starts its workers, with the configuration its records meet."""
    if not getattr(_carrying, "on", 0) or not configured(logger) or uncarried(logger):
        return logger.__reduce__()
    links = [(_name(link), link.level, link.propagate, link.disabled, list(link.filters),
              list(link.handlers)) for link in chain(logger)]
    return configured_in_worker, (_name(logger), links)


def _name(logger):
    return None if logger is logging.root else logger.name


def _logger(name):
    return logging.getLogger(name) if name is not None else logging.root


_replaced: set[str] = set()  # in a worker: the loggers configured from the training process's


def configured_in_worker(name, links):
    """In a worker: the logger ``name``, its chain configured as the training
    process's is (replacing what this process configured, once)."""
    for link_name, level, propagate, disabled, filters, handlers in links:
        link = _logger(link_name)
        if link_name in _replaced:
            continue
        _replaced.add(link_name)
        for own in list(link.handlers):  # the worker's import configured these
            link.removeHandler(own)
            try:
                own.close()
            except Exception:
                pass
        for handler in handlers:
            link.addHandler(handler)
        link.setLevel(level)
        link.propagate, link.disabled = propagate, disabled
        link.filters = list(filters)
    return _logger(name)


def reducers(loggers):
    """The reducers a worker start needs for ``loggers``: theirs, and their
    handlers' (made again)."""
    table = {type(logger): reduce_logger for logger in loggers}
    table[logging.Logger] = reduce_logger
    table[logging.RootLogger] = reduce_logger
    table.update(_handlers.handler_reducers(handler_classes(loggers)))
    return table
