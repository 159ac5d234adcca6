"""The user's unheld locks, sent to spawned workers as new, unlocked ones, as fork
gives them (DL201): spawn cannot send a lock, so a dataset guarding a cache with
one would run only on fork, which a Mac lacks. The primitives around one pickle
by their attributes. A held lock's pickle fails (the ladder goes on; fork refuses
it too: ``holdings.fork_blockers``). A library object's lock (a ZipFile's) guards
its state, which a new lock beside a copy would not (``holdings.users_locks``).
"""

import threading

from ..inspection import holdings


def _reduce_lock(lock):
    if holdings.held(lock):
        raise TypeError("a lock held right now cannot be sent: a worker would wait for "
                        "it forever")
    return (threading.RLock if holdings.threading_kind(lock) == "rlock" else threading.Lock), ()


def lock_reducers():
    return dict.fromkeys((type(threading.Lock()), type(threading.RLock())), _reduce_lock)
