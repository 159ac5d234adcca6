"""Locks a dataset holds, sent to spawned workers as new, unlocked ones, as fork
gives them (DL201; a held one is never forked: ``holdings.fork_blockers``).
Spawn cannot send a lock (``TypeError: cannot pickle '_thread.lock' object``):
a dataset guarding a cache with one runs only on fork, which a Mac lacks. The
Condition, Semaphore and Event around one pickle by their attributes. A held
lock is refused: its pickle fails and the ladder takes the next rung. Only the
user's own locks: a library object's lock (a ZipFile's) guards that object's
state, which a new lock beside a copy would not (``holdings.UsersLocks``).
"""

import threading

from ..inspection import holdings

LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


def _reduce_lock(lock):
    if holdings.held(lock):
        raise TypeError("a lock held right now cannot be sent: a worker would wait for "
                        "it forever")
    return (threading.RLock if holdings.threading_kind(lock) == "rlock" else threading.Lock), ()


def lock_reducers():
    return {cls: _reduce_lock for cls in LOCK_TYPES}
