"""Imported by the warm server of DL209 as it starts (never by your process).

A worker forked from the server goes through spawn's start: the
preparation data, then the pickled process object. A failure there (a
dataset whose unpickling raises, a main module that does not import) kills
the worker before any of its steps run, and multiprocessing prints the
traceback to a stderr the training process cannot read. The server's
children are ours to start, so each is told (in its preparation data,
under ``DUMPS_KEY``) where to leave that traceback for recovery to read
(``dumps.bootstrap_path``).
"""

import os
import sys
from multiprocessing import spawn

from .dumps import DUMPS_KEY, bootstrap_path

_prepare = spawn.prepare


def _prepare_and_report(data):
    directory = data.pop(DUMPS_KEY, None)
    if directory:
        _leave_traceback_in(directory)
    return _prepare(data)


def _leave_traceback_in(directory):
    """In the worker: an exception that ends its start is also written down.
    (The forkserver's child reports it through ``sys.excepthook``.)"""
    shown = sys.excepthook

    def hook(kind, value, tb):
        try:
            import traceback

            with open(bootstrap_path(directory, os.getpid()), "w") as f:
                traceback.print_exception(kind, value, tb, file=f)
        except Exception:
            pass
        shown(kind, value, tb)

    sys.excepthook = hook


spawn.prepare = _prepare_and_report
