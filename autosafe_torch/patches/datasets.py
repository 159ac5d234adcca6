"""``Dataset.__new__`` and each dataset class's own ``__init__``: the program's
construction of a dataset, recorded for the rebuild rung (``remedies/rebuild.py``,
NOTE [the rebuild's three places], 1).

``__new__`` sees every construction of every subclass with the call's
arguments, then runs the next ``__new__`` along the MRO (a mixin's still
runs). At a class's first construction, the ``__init__`` it runs (a Python
function) is bounded by ``MeasuredInit``, which records that call for the
dataset ``__new__`` made and no other (in a ``super().__init__()``, the
outer call measures). ``Class.__init__`` reads as the function itself, so a
class sent by value (cloudpickle) carries it, not the wrapper. torch's own
datasets hold nothing a worker cannot receive: never recorded.
"""

import contextlib
import functools
import threading
import types
import weakref

from torch.utils.data import Dataset

from . import replace

# .ref: the dataset __new__ made, weakly (a copy or an unpickled one gets no __init__),
# until its __init__; .made: its record
_pending = threading.local()


def patch(torch):
    replace(Dataset, "__new__", staticmethod(_recording_new))


def unpatch():
    """After ``revert``: a ``__new__`` that only does what ``__new__`` did before.
    Deleting ours is not enough: CPython keeps the slot it made for it, and
    ``object.__new__`` would then refuse every subclass's arguments."""
    Dataset.__new__ = staticmethod(_plain_new)


def _plain_new(cls, *args, **kwargs):
    """What ``Dataset(...)`` does without the shim, object.__new__'s refusal of
    arguments included."""
    following = super(Dataset, cls).__new__
    if following is not object.__new__:
        return following(cls, *args, **kwargs)
    if (args or kwargs) and cls.__init__ is object.__init__:
        # what object.__new__ says when neither method takes arguments
        raise TypeError("%s() takes no arguments" % cls.__name__)
    return object.__new__(cls)


def _recording_new(cls, *args, **kwargs):
    obj = _plain_new(cls, *args, **kwargs)
    with contextlib.suppress(Exception):  # a record is an option: never the user's problem
        _record(obj, cls, args, kwargs)
    return obj


def _record(obj, cls, args, kwargs):
    from ..remedies import rebuild  # noqa: PLC0415 - 0.7 ms at `import torch`, where the patches load (-X importtime: remedies.rebuild, descriptors, opened, generators)

    if not rebuild.recording() or (cls.__module__ or "").startswith("torch."):
        return
    made = rebuild.begin(obj, cls, args, kwargs)
    if made is None:
        return
    # the __init__ that cls(...) runs, and the class that defines it
    owner = next(k for k in cls.__mro__ if vars(k).get("__init__") is not None)
    init = vars(owner)["__init__"]
    if init is object.__init__:
        made.opened, made.attrs = [], {}  # nothing runs: nothing opened
        return
    if (owner.__module__ or "").startswith("torch.") \
            or type(init) not in (types.FunctionType, MeasuredInit):
        return  # not the program's Python code: its end is not seen
    if type(init) is types.FunctionType:
        replace(owner, "__init__", MeasuredInit(init))
    _pending.ref, _pending.made = weakref.ref(obj), made


class MeasuredInit:
    """A dataset class's ``__init__``, bounded where it builds the dataset that
    ``__new__`` just made; otherwise the function itself, unchanged."""

    def __init__(self, function):
        functools.update_wrapper(self, function)

    def __get__(self, obj, owner=None):
        if obj is None:
            return self.__wrapped__
        return types.MethodType(self, obj)

    def __call__(self, obj, *args, **kwargs):
        ref = getattr(_pending, "ref", None)
        if ref is None or ref() is not obj:
            return self.__wrapped__(obj, *args, **kwargs)
        made, _pending.ref, _pending.made = _pending.made, None, None
        from ..remedies import rebuild  # noqa: PLC0415 - 0.7 ms at `import torch`, where the patches load (-X importtime: remedies.rebuild, descriptors, opened, generators)

        return rebuild.measured(made, obj, self.__wrapped__, args, kwargs)

    def __reduce__(self):
        return _unwrapped, (self.__wrapped__,)


def _unwrapped(function):
    return function
