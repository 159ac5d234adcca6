"""Locks a dataset holds, sent to spawned workers as new, unlocked ones (DL201).

A forked worker gets a copy of each lock in the state it had at the fork: a
lock nobody holds arrives unheld, as a fresh one (a held one is never forked:
``holdings.fork_blockers``). Spawn cannot send a lock at all (``TypeError:
cannot pickle '_thread.lock' object``), so a dataset that guards a cache with
one runs only on fork, which a Mac does not have. Sent as a new lock of its
kind, a lock nobody holds arrives as fork would give it; so do the Condition,
Semaphore and Event around one, which pickle by their attributes. A lock held
right now is refused, by the reducer itself: its pickle fails and the ladder
takes the next rung, as for fork. Only the user's own locks: one that a
library's object holds (a ZipFile's, a Queue's) guards that object's state,
which a new lock beside a copy of it would not be (``UsersLocks``).
"""

import os
import sys
import threading

from .. import callsite
from ..inspection import holdings, objwalk

LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


def _new_lock(kind):
    return threading.RLock() if kind == "rlock" else threading.Lock()


def _reduce_lock(lock):
    if holdings.held(lock):
        raise TypeError("a lock held right now cannot be sent: a worker would wait for "
                        "it forever")
    return _new_lock, (holdings.threading_kind(lock),)


def lock_reducers():
    """Reducers that send an unheld lock to a spawned worker as a new one."""
    return {cls: _reduce_lock for cls in LOCK_TYPES}


def unheld_lock(value):
    """A lock, or a Condition, Semaphore, Event or Barrier around one, that
    nobody holds now: it travels."""
    return holdings.threading_kind(value) not in (None, "thread") and not holdings.held(value)


_CONTAINERS = (list, tuple, dict, set, frozenset)


class UsersLocks:
    """The unheld locks that objects of the user's own hold (their class not
    from an installed library nor the standard library), directly or through
    threading's primitives and built-in containers, from one walk of the
    loader's parts (``{name: part}``): ``holds(lock)`` for any of them, and
    ``named``, ``(path, obj)`` of each outermost one (a Condition, not the
    lock inside it), as the log names them."""

    def __init__(self, parts):
        self._owners: dict[int, object] = {}
        primitives = []
        for name, part in parts.items():
            if part is None:
                continue
            for here, obj, edge in objwalk.walk(part, name):
                if edge is not None:
                    self._owners.setdefault(id(obj), edge.owner)
                if unheld_lock(obj):
                    primitives.append((here, obj))
        self.named = [(here, obj) for here, obj in primitives if self._users(obj)
                      and holdings.threading_kind(self._owners.get(id(obj))) is None]

    def holds(self, lock):
        return unheld_lock(lock) and self._users(lock)

    def _users(self, obj):
        owner = self._owners.get(id(obj))
        while owner is not None and (holdings.threading_kind(owner) is not None
                                     or objwalk.is_a(owner, _CONTAINERS)):
            owner = self._owners.get(id(owner))
        return owner is not None and users_class(type(owner))


def users_class(cls):
    """A class of the user's own: not from an installed library nor the
    standard library."""
    name = getattr(cls, "__module__", "")
    if name in ("__main__", "__mp_main__"):
        return True
    path = getattr(sys.modules.get(name), "__file__", None)
    return bool(path and not os.path.realpath(path).startswith(callsite.installed_dirs()))
