"""Inside a build server: the datasets of a rebuilt loader, built once, from
which every worker of every epoch is forked (DL201's rebuild, made cheap).

A dataset built again in each worker (``rebuild.py``) would run its
constructor (a 2 s CSV parse, and its transient memory) once per worker per
epoch. A build server (``warmstart.Build``) imports what the warm server
imports, then this module, which prepares as a spawned worker does, sets
what the workers' code reads (DL220), then builds each dataset once. Each
worker forked from it holds the dataset copy-on-write, with its own
description of every file (``isolation.after_fork_in_server_child``); the
training process sends a reference (``from_server``) with what the dataset
holds at that worker's start, checked there: a dataset changed between
epochs is never served stale. The recipes go by the plain pickler (a server
takes no handle of the training process's). Imported elsewhere: nothing.
"""

from __future__ import annotations

import contextlib
import io
import pickle
from typing import Any
from multiprocessing import spawn

from ..inspection.diagnostics import in_fork_server
from ..mp_private import forkserver_handed, inheriting
from . import process_state, rebuild

# the recipes' file in the server's preload list: this (no module's name: forkserver
# passes over what does not import), then its path
RECIPES = "autosafe_torch_build_recipes="
# in a build server and its children: key -> the dataset built (or Unbuilt)
BUILT: dict[Any, Any] = {}


def from_server(key, expected):
    """The dataset the build server built, if it still holds what the training
    process's holds now, else ``rebuild.Unbuilt``."""
    built = BUILT.get(key)
    if built is None:
        return rebuild.Unbuilt("the dataset (%s) was not built in the server that started "
                               "this worker" % expected.name)
    return rebuild.still_the_same(built, expected)


def _build():
    handed = forkserver_handed(RECIPES)
    if handed is None:
        return
    with inheriting():
        f = io.BytesIO(handed)
        spawn.prepare(pickle.load(f))
        state = pickle.load(f)
        recipes = pickle.load(f)
        if state is not None:  # what main() set, in place before the build (DL220)
            with contextlib.suppress(Exception):  # each worker compares again
                process_state.arrive_in_server(*pickle.loads(state))
        for key, (build, args) in recipes.items():
            with contextlib.suppress(Exception):  # workers fail their start without it, and say so
                BUILT[key] = build(*args)


if in_fork_server():
    _build()
