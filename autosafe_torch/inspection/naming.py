"""A few words for a value in a log line: never a repr (an address, our
internals). Used by the rules' records and by the remedies' refusals."""

import contextlib
import types
import weakref

from . import holdings


def brief(value):
    """A value as a log line may show it: short literals as written, functions
    and classes by name, anything else by its kind."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else "a string"
    with contextlib.suppress(Exception):  # a user's object may raise anything from its attributes
        ours = __package__.split(".")[0]
        func = getattr(value, "func", None)  # functools.partial: a worker_init_fn step of ours
        if func is not None and str(getattr(func, "__module__", "")).startswith(ours):
            return "a step of %s's" % ours
        name = getattr(value, "__qualname__", None)
        if isinstance(name, str) and callable(value):
            return name
    cls = type(value)
    if cls in (weakref.ProxyType, weakref.CallableProxyType):
        return "a weak proxy"
    module = getattr(cls, "__module__", "") or ""
    if module.startswith("_") and module != "__main__":  # a C type: _csv.reader
        return a_or_an("%s.%s" % (module.lstrip("_"), cls.__name__))
    return a_or_an(cls.__name__)


def a_or_an(noun):
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def what_is(value):
    """A few words for what a dataset holds or a loader is given: "an open
    file", "a lambda", "a thread pool"... (``brief`` for anything else)."""
    with contextlib.suppress(Exception):  # a user's object may raise anything from its attributes
        if isinstance(value, (types.FunctionType, type)):
            thing = "class" if isinstance(value, type) else "function"
            if value.__name__ == "<lambda>":
                return "a lambda"
            if "<locals>" in value.__qualname__:
                return "a local " + thing
            if value.__module__ == "__main__":
                return "a %s of __main__" % thing
            return "a " + thing
        handle = holdings.fork_unsafe(value)
        if handle is not None:
            return a_or_an(handle)
        if type(value).__name__ == "Connection" and "sqlite" in type(value).__module__:
            return "a sqlite connection"
        if isinstance(value, holdings.h5py_types()):  # () where h5py is not imported
            return "an h5py " + type(value).__name__
        if holdings.is_file_object(value):
            return "an open file"
        if type(value).__module__ == "mmap":
            return "an mmap"
        if holdings.thread_pool_in_use(value) is not None:
            return "a thread pool"
        kind = holdings.threading_kind(value)
        if kind is not None:
            return "a threading " + kind
    return brief(value)


def number_of(count, thing):
    return "%d %s%s" % (count, thing, "" if count == 1 else "s")
