"""What a dataset's code reads from the process, not from the dataset: checked in
each spawned worker of a repaired loader.

Pickling a dataset carries its attributes; it carries its class and the
functions it calls by name. A spawned worker imports them again, as the
script left them at import: a class attribute the program set at run time
(``Features.version = args.version``), or a module-level value ``main()``
changed (a config dict set from argparse, a registry filled), is back at its
default there, while a forked worker has the program's. Where the shim sends
a loader to spawn workers with repairs of its own (``state["_process_state"]``
on the findings that do), the training process fingerprints, at each
iterator's start (``expected``), the class attributes of the dataset's own
classes and the module-level values their methods name (plain data: not
modules, functions or classes), and each worker compares its own before its
first batch (``check_in_worker``, a worker_init step). A difference fails the
worker's start, naming it (``RemedyFailed``): the recovery takes emulated
workers, which run in this process and read what the program set, or stops
with the reason. Nothing is carried: a value the program set would mean
setting the worker's module state, which nothing here can show to be whole.

"Own" classes are the program's: not those of installed libraries or the
standard library. Fingerprints are ``inspection/digest.py``'s.
"""

import functools
import os
import sys
import sysconfig
import types

from ..inspection import digest
from ..inspection.failures import RemedyFailed

# How a worker says it (its error travels as text), and the permanent fix.
DIFFERS = "is not in this spawned worker what it is in the training process"
FIX = ("keep what the dataset's methods read on the dataset itself (set in __init__ from its "
       "arguments), not on its class or module, or set it in worker_init_fn")

_CODE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type,
         types.ModuleType, staticmethod, classmethod, property)
# Construction: what it read is in the attributes the dataset pickles with (and a
# dataset built again in the worker is checked by the rebuild's own check).
_CONSTRUCTION = frozenset({"__init__", "__new__", "__init_subclass__", "__class_getitem__"})


@functools.lru_cache(maxsize=1)
def _library_dirs():
    paths = sysconfig.get_paths()
    dirs = [paths[k] for k in ("purelib", "platlib", "stdlib", "platstdlib") if k in paths]
    dirs += [p for p in sys.path if isinstance(p, str)
             and os.path.basename(p) in ("site-packages", "dist-packages")]
    return tuple(os.path.realpath(d) + os.sep for d in dirs)


def _programs(cls):
    """Whether ``cls`` is the program's own (not a library's, not Python's)."""
    module = sys.modules.get(getattr(cls, "__module__", None) or "")
    path = getattr(module, "__file__", None)
    if module is None or not path:
        return module is not None and module.__name__ in ("__main__", "__mp_main__")
    return not os.path.realpath(path).startswith(_library_dirs())


def _datasets(dataset):
    """The dataset and those torch's wrappers hold (Subset, ConcatDataset)."""
    found, todo = [], [dataset]
    while todo and len(found) < 64:
        ds = todo.pop()
        found.append(ds)
        inner = getattr(type(ds), "__module__", "").startswith("torch.utils.data") and (
            vars(ds).get("datasets") or [vars(ds).get("dataset")])
        todo.extend(d for d in inner or () if d is not None)
    return found


def _functions(value):
    value = getattr(value, "__wrapped__", value)  # patches.datasets.MeasuredInit
    if type(value) in (staticmethod, classmethod):
        value = value.__func__
    if type(value) is property:
        return [f for f in (value.fget, value.fset) if type(f) is types.FunctionType]
    return [value] if type(value) is types.FunctionType else []


def _names(code, depth=0):
    names = set(code.co_names)
    if depth < 4:
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                names |= _names(const, depth + 1)
    return names


def _module_name(module_globals):
    name = module_globals.get("__name__", "?")
    return "__main__" if name == "__mp_main__" else name


def _read(dataset):
    """``{label: value}`` of the process state the dataset's own classes read."""
    found = {}
    for ds in _datasets(dataset):
        for klass in type(ds).__mro__:
            if not _programs(klass):
                continue
            for name, value in vars(klass).items():
                if name in _CONSTRUCTION:
                    continue
                for function in _functions(value):
                    scope = function.__globals__
                    for global_name in _names(function.__code__):
                        if global_name in scope and not isinstance(scope[global_name], _CODE):
                            found.setdefault("the global %s of %s" % (
                                global_name, _module_name(scope)), scope[global_name])
                if not isinstance(value, _CODE) and not _functions(value) \
                        and not (name.startswith("__") and name.endswith("__")):
                    found.setdefault("%s.%s" % (klass.__qualname__, name), value)
    return found


def _fingerprints(dataset):
    out = {}
    for label, value in _read(dataset).items():
        try:
            out[label] = digest.digest(value)
        except Exception:  # too deep, or it raises: not compared
            continue
    return out


def expected(dataset):
    """What a worker's dataset classes must read (fingerprints), or None."""
    try:
        return _fingerprints(dataset) or None
    except Exception:
        return None


def check_in_worker(fingerprints, worker_id):
    """Worker step: the process state this worker's dataset reads is the
    training process's, or ``RemedyFailed`` naming what differs."""
    from torch.utils.data import get_worker_info  # noqa: PLC0415 - the rules load without torch (explain, doctor)

    info = get_worker_info()
    if info is None or not fingerprints:
        return
    mine = _fingerprints(info.dataset)
    for label, value in fingerprints.items():
        if label in mine and mine[label] != value:
            raise RemedyFailed("%s %s (set after import: the worker imported the script "
                               "again)" % (label, DIFFERS))
