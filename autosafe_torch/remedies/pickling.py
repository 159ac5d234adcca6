"""Reducers registered with multiprocessing's ForkingPickler, and taken back.

The repairs that make a dataset travel to spawn/forkserver workers are
reducers: planning only names them (the probe tries them without
installing anything); they are installed when a finding is applied, in fix
mode, and ``uninstall_reducers`` puts back what was there before.

ForkingPickler's table is the process's: the program's own ``Queue.put``,
``Pipe.send`` and ``Pool.map`` pickle with it too, and a forked worker sends
its batches with what it inherited. Our reducers act only while this thread
sends what a repaired loader's workers get (``sending()``: their start, an
emulated worker's copy); anywhere else each gives way to what the class had
before (torch's reducer, the program's own, or pickle's default), so that a
program's own pickling fails or succeeds as it would without us.
"""

from __future__ import annotations

import contextlib
import copyreg
import threading
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable

from ..mp_private import extra_reducers

PROTOCOL = __import__("pickle").DEFAULT_PROTOCOL

_MISSING = object()


def built_from_attributes(cls, state):
    """In a worker: an instance of ``cls`` as pickle's default builds it
    (``cls.__new__``, then its ``__dict__``), without asking the empty
    instance for ``__setstate__``: a class that forwards unknown attributes
    would recurse there (``holdings.forwards_attributes``)."""
    obj = cls.__new__(cls)
    object.__getattribute__(obj, "__dict__").update(state)
    return obj


def reduce_from_attributes(obj):
    return built_from_attributes, (type(obj), dict(object.__getattribute__(obj, "__dict__")))


def forwarder_reducers(classes):
    """Reducers for instances of ``classes`` (attribute forwarders)."""
    return {cls: reduce_from_attributes for cls in classes}
_installed: dict[Any, Any] = {}  # type -> the reducer it had before us (or _MISSING)
_sending = threading.local()


@contextlib.contextmanager
def sending() -> Iterator[None]:
    """While this thread pickles what a repaired loader's workers get: the
    reducers installed here act (see the module)."""
    depth = getattr(_sending, "depth", 0)
    _sending.depth = depth + 1
    try:
        yield
    finally:
        _sending.depth = depth


def is_sending() -> bool:
    return getattr(_sending, "depth", 0) > 0


class Scoped:
    """What ForkingPickler holds for a class we reduce: ``reducer`` while
    ``sending()``, else ``previous`` (the class's reducer before us), else
    pickle's own way (copyreg's table, then ``__reduce_ex__``)."""

    __slots__ = ("reducer", "previous")

    def __init__(self, reducer: Callable[[Any], Any], previous: Any) -> None:
        self.reducer, self.previous = reducer, previous

    def __call__(self, obj: Any) -> Any:
        if is_sending():
            return self.reducer(obj)
        if self.previous is not _MISSING:
            return self.previous(obj)
        reduce = copyreg.dispatch_table.get(type(obj))
        return reduce(obj) if reduce is not None else obj.__reduce_ex__(PROTOCOL)


def install(reducers):
    """Register ``{class: reducer}`` with ForkingPickler, scoped (``Scoped``),
    remembering the old ones; a class we reduce already gets the newer reducer."""
    for cls, reducer in reducers.items():
        current = extra_reducers().get(cls, _MISSING)
        if isinstance(current, Scoped):
            current.reducer = reducer
            continue
        if cls not in _installed:
            _installed[cls] = current
        ForkingPickler.register(cls, Scoped(reducer, current))


def installed(cls):
    """Our reducer for ``cls``, or None."""
    current = extra_reducers().get(cls)
    return current.reducer if isinstance(current, Scoped) else None


def before_us(cls):
    """The reducer ``cls`` had before ours (None: pickle's own way)."""
    current = extra_reducers().get(cls)
    if isinstance(current, Scoped):
        current = current.previous
    return None if current is _MISSING else current


def install_override(reducer_override):
    """Give ForkingPickler a ``reducer_override`` (functions and classes by
    value) that acts while ``sending()``, remembering what it had, which
    answers for everything else."""
    if _OVERRIDE not in _installed:
        _installed[_OVERRIDE] = ForkingPickler.__dict__.get("reducer_override", _MISSING)
    previous = _installed[_OVERRIDE]

    def scoped_override(pickler, obj):
        if is_sending():
            reduced = reducer_override(pickler, obj)
            if reduced is not NotImplemented:
                return reduced
        return NotImplemented if previous is _MISSING else previous(pickler, obj)

    ForkingPickler.reducer_override = scoped_override  # type: ignore[method-assign]  # patched on purpose


_OVERRIDE = "reducer_override"


def uninstall_reducers():
    """Put back what ForkingPickler had before any registration made here."""
    previous = _installed.pop(_OVERRIDE, None)
    if previous is _MISSING:
        del ForkingPickler.reducer_override
    elif previous is not None:
        ForkingPickler.reducer_override = previous  # type: ignore[method-assign]  # put back

    for cls, previous in _installed.items():
        if previous is _MISSING:
            extra_reducers().pop(cls, None)
        else:
            extra_reducers()[cls] = previous
    _installed.clear()
