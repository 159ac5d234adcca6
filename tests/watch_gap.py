"""What a torch without the watch's names shows by design (``torch_private.
watched_missing``: a torch whose private names moved; every supported torch has
them, torch 2.0 through ``torch_private._WatchedAtIndex``): the one line that says its
workers are not watched, and no step down from a failure in a worker (a repair a
worker could not apply stops the run with NoExactRung: ``recovery.UnwatchedIter``).
tests/test_healthy.py filters the same line its own way."""

import pytest

from autosafe_torch import torch_private
from support import shim_lines

MISSING = torch_private.watched_missing()
NOT_WATCHED = "workers not watched"


def acted(stderr):
    """The shim's lines, less the one a torch without the watch's names gets by
    design."""
    return [line for line in shim_lines(stderr) if not (MISSING and NOT_WATCHED in line)]


def needs_watch(what):
    """A named skip for a test of what only watched workers do (``what``)."""
    return pytest.mark.skipif(bool(MISSING), reason="needs torch >= 2.1: this torch lacks %s, "
                              "so %s" % (MISSING or "nothing", what))
