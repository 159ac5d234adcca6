"""The ladder's vocabulary: its rungs, by the words the log uses for them.

Below every layer (the records in report.py name the rung a finding chose; the
rules choose it, the recovery steps down from it): imports nothing of ours.
"""

from __future__ import annotations

import enum


class Rung(str, enum.Enum):
    """The rungs, in the ladder's order, by the words the log uses for them
    (``strategy``). At ``iter()``: as asked (repaired where needed, DL201-
    DL203, DL208), spawn (away from an unsafe fork), fork (where spawn's
    pickles fail and fork is safe: ``fork_is_safe``), rebuilt in each worker
    (no fork rung: the pickling planner approves it), emulated. After a
    failure, per kind (``LADDERS``): restart, fewer batches in flight,
    file_system sharing, spawn workers, emulated."""

    AS_ASKED = "workers as asked"
    SPAWN = "start method: spawn"
    WARM_SPAWN = "warm forkserver"  # spawn's semantics, forked from a warm server (DL209)
    FORK = "start method: fork"
    REBUILT = "rebuilt in each worker"
    RESTART = "restart workers"
    FEWER = "fewer batches in flight"
    FILE_SYSTEM = "file_system sharing"
    SPAWN_WORKERS = "spawn workers"  # after forked workers failed: new ones by spawn
    EMULATED = "emulated workers (in process)"

    def __str__(self) -> str:
        return self.value
