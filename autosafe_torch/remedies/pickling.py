"""Reducers registered with multiprocessing's ForkingPickler, and taken back.

The repairs that make a dataset travel to spawn/forkserver workers are
reducers: planning only names them (the probe tries them without
installing anything); they are installed when a finding is applied, in fix
mode, and ``uninstall_reducers`` puts back what was there before.
"""

from __future__ import annotations

from multiprocessing.reduction import ForkingPickler
from typing import Any

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
_installed: dict[type, Any] = {}  # type -> the reducer it had before us (or _MISSING)


def install(reducers):
    """Register ``{class: reducer}`` with ForkingPickler, remembering the old ones."""
    for cls, reducer in reducers.items():
        if cls not in _installed:
            _installed[cls] = extra_reducers().get(cls, _MISSING)
        ForkingPickler.register(cls, reducer)


def install_override(reducer_override):
    """Give ForkingPickler a ``reducer_override`` (functions and classes by
    value), remembering what it had."""
    if _OVERRIDE not in _installed:
        _installed[_OVERRIDE] = ForkingPickler.__dict__.get("reducer_override", _MISSING)
    ForkingPickler.reducer_override = reducer_override


_OVERRIDE = "reducer_override"


def uninstall_reducers():
    """Put back what ForkingPickler had before any registration made here."""
    previous = _installed.pop(_OVERRIDE, None)
    if previous is _MISSING:
        del ForkingPickler.reducer_override
    elif previous is not None:
        ForkingPickler.reducer_override = previous

    for cls, previous in _installed.items():
        if previous is _MISSING:
            extra_reducers().pop(cls, None)
        else:
            extra_reducers()[cls] = previous
    _installed.clear()
