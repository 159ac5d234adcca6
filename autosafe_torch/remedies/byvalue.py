"""By value: functions, lambdas and classes that pickle cannot find by name.

Plain pickle saves functions and classes by reference (module and name); a
lambda, a local function, or anything defined in an interactive
``__main__`` cannot be looked up in a worker. cloudpickle sends them whole.
"""

import copyreg
import types

from ..inspection.mainmodule import importable_by_reference
from .pickling import PROTOCOL, WorkerPickler, install


class ByValue:
    """A collate_fn/worker_init_fn that pickles its function by value."""

    __slots__ = ("function", "__weakref__")

    def __init__(self, function):
        self.function = function

    def __call__(self, *args, **kwargs):
        return self.function(*args, **kwargs)

    def __reduce__(self):
        return ByValue, (_Whole(self.function),)

    def __repr__(self):
        return "by_value(%r)" % (self.function,)


def by_value(fn):
    return fn if isinstance(fn, ByValue) else ByValue(fn)


class _Whole:
    """Stands in for a class or function in a reduce value; unpickles as it."""

    __slots__ = ("whole",)

    def __init__(self, whole):
        self.whole = whole

    def __call__(self, *args, **kwargs):  # pickle requires the callable be callable
        return self.whole(*args, **kwargs)

    def __reduce__(self):
        return _whole(self.whole)


def _whole(obj, **protocol):
    import cloudpickle  # noqa: PLC0415 - 5.5 ms at `import torch`, where this module loads (-X importtime: cloudpickle)

    return cloudpickle.loads, (cloudpickle.dumps(obj, **protocol),)


def _new_instance(cls, *args):
    return cls.__new__(cls, *args)


def _new_instance_ex(cls, args, kwargs):
    return cls.__new__(cls, *args, **kwargs)


def _reduce_instance_by_value(obj):
    """Only the class goes by value: the state still goes through WorkerPickler,
    so tensors are shared, not copied, and files use their reducers (``reopen``)."""
    cls = type(obj)
    rv = obj.__reduce_ex__(PROTOCOL)
    if isinstance(rv, str):
        raise TypeError("cannot pickle %r by value" % (obj,))
    func, args, rest = rv[0], tuple(rv[1] or ()), tuple(rv[2:])
    if func is copyreg.__newobj__:  # type: ignore[attr-defined]  # not in typeshed
        func = _new_instance
    elif func is copyreg.__newobj_ex__:  # type: ignore[attr-defined]  # not in typeshed
        func = _new_instance_ex
    elif func is cls:
        func = _Whole(cls)
    args = tuple(_Whole(a) if a is cls else a for a in args)
    return (func, args) + rest


def class_reducers(classes):
    return dict.fromkeys(classes, _reduce_instance_by_value)


def register_by_value_class(cls):
    """Instances of ``cls`` (from an interactive ``__main__``) travel with their class."""
    install(class_reducers((cls,)))


def _reducer_override(pickler, obj):
    """WorkerPickler's ``reducer_override``: a function or class a worker cannot
    import (a lambda in a transform, a class defined in ``main()``) goes by value."""
    if isinstance(obj, (types.FunctionType, type)) and not importable_by_reference(obj):
        return _whole(obj, protocol=PROTOCOL)
    return NotImplemented


def send_by_value_where_needed():
    """DL202's remedy, for functions and classes anywhere in what workers get."""
    WorkerPickler.override = _reducer_override
