"""Logging handlers a dataset holds, made again in each spawned worker (DL201).

A forked worker inherits a ``FileHandler`` with its open file and a new lock
(``logging`` reinitialises handler locks after fork); a spawned one cannot
receive it (its lock and stream do not pickle), so it gets the same: the
class and attributes, a new lock, the file opened again for appending (never
truncated: a ``mode='w'`` handler's file is the parent's, truncated once). A
``StreamHandler`` on stdout/stderr writes to the worker's; other streams are
not made again (``holdings.rebuildable``): the ladder goes on.
"""

import logging
import sys

from ..inspection.holdings import _STDIO, _stdio_name, rebuildable
from .pickling import PROTOCOL


def reduce_handler(handler):
    if not rebuildable(handler):
        return handler.__reduce_ex__(PROTOCOL)  # raises, as ever
    state = dict(vars(handler))
    stream = state.pop("stream", None)
    state.pop("lock", None)
    # Methods of the stream set on the handler itself (transformers' default
    # handler has `flush = sys.stderr.flush`): bound again to the worker's stream.
    of_stream = {name: value.__name__ for name, value in state.items()
                 if stream is not None and getattr(value, "__self__", None) is stream}
    for name in of_stream:
        del state[name]
    if isinstance(handler, logging.FileHandler):
        how = "file" if stream is not None else None  # delay=True, or closed
    else:
        how = _stdio_name(stream)
    return made_again, (type(handler), state, how, of_stream)


def made_again(cls, state, how, of_stream=None):
    """In a worker: the handler as a forked worker would hold it."""
    handler = cls.__new__(cls)
    handler.__dict__.update(state)
    handler.createLock()
    if how == "file":
        mode = handler.mode
        handler.mode = mode.replace("w", "a")  # the parent's file: appended to, as fork does
        try:
            handler.stream = handler._open()
        finally:
            handler.mode = mode
    elif how in _STDIO:
        handler.stream = getattr(sys, how)
    else:
        handler.stream = None
    for name, method in (of_stream or {}).items():
        if handler.stream is not None:
            setattr(handler, name, getattr(handler.stream, method))
    logging._addHandlerRef(handler)  # type: ignore[attr-defined]  # private: flushed and closed at the worker's exit
    return handler


def handler_reducers(classes):
    return dict.fromkeys(classes, reduce_handler)
