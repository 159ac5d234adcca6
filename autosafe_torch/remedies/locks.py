"""Locks a dataset holds, sent to spawned workers as new, unlocked ones (DL201).

A forked worker gets each lock as it was at the fork: unheld (a held one is
never forked: ``holdings.fork_blockers``). Spawn cannot send a lock at all
(``TypeError: cannot pickle '_thread.lock' object``), so a dataset that
guards a cache with one runs only on fork, which a Mac does not have. Sent
as a new lock of its kind, an unheld lock arrives as fork would give it; so
do the Condition, Semaphore and Event around one, which pickle by their
attributes. A lock held right now is refused: its pickle fails and the
ladder takes the next rung, as for fork. Only the user's own locks: a
library object's lock (a ZipFile's, a Queue's) guards that object's state,
which a new lock beside a copy would not (``holdings.UsersLocks``).
"""

import threading

from ..inspection import holdings

LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


def _new_lock(kind):
    return threading.RLock() if kind == "rlock" else threading.Lock()


def _reduce_lock(lock):
    if holdings.held(lock):
        raise TypeError("a lock held right now cannot be sent: a worker would wait for "
                        "it forever")
    return _new_lock, (holdings.threading_kind(lock),)


def lock_reducers():
    return {cls: _reduce_lock for cls in LOCK_TYPES}
