"""Reducers registered with multiprocessing's ForkingPickler, and taken back.

The repairs that make a dataset travel to spawn/forkserver workers are
reducers: planning only names them (the probe tries them without
installing anything); they are installed when a finding is applied, in fix
mode, and ``uninstall_reducers`` puts back what was there before.
"""

PROTOCOL = __import__("pickle").DEFAULT_PROTOCOL

_MISSING = object()
_installed = {}  # type -> the reducer it had before us (or _MISSING)


def install(reducers):
    """Register ``{class: reducer}`` with ForkingPickler, remembering the old ones."""
    from multiprocessing.reduction import ForkingPickler

    for cls, reducer in reducers.items():
        if cls not in _installed:
            _installed[cls] = ForkingPickler._extra_reducers.get(cls, _MISSING)
        ForkingPickler.register(cls, reducer)


def uninstall_reducers():
    """Put back what ForkingPickler had before any registration made here."""
    from multiprocessing.reduction import ForkingPickler

    for cls, previous in _installed.items():
        if previous is _MISSING:
            ForkingPickler._extra_reducers.pop(cls, None)
        else:
            ForkingPickler._extra_reducers[cls] = previous
    _installed.clear()
