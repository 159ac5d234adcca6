"""One pass over what a loader's parts send a spawned worker, at C speed: the inventory.

The pickler is the walker: containers and plain values are traversed in C
(an ImageNet index of 1.28M ``(path, class)`` tuples: well under a second,
where a Python walk took some 25 us an object). Every other object reaches
``reducer_override``, which notes it by kind (``classify``) and pickles it
as a worker's pickler would, up to the first object that does not pickle,
where the pass ends. Payloads (tensors, storages, arrays) stand in:
their bytes say nothing of pickling, and torch's reducers would move a
storage into shared memory. Nothing is capped or sampled: a pass sees
everything or says it did not (``complete`` False), and a check decides as
for a hazard it cannot rule out. No user code runs but ``__reduce__`` and
``__getstate__``, as torch's own pickling runs them.
"""

import contextlib
import functools
import gc
import io
import pickle
import sys
import threading
import types
from multiprocessing import context

from ..mp_private import python_rlock
from .failures import kept
from .holdings import loaded
from .objwalk import CODE, NULL_SINK
from .slots import instance_dict

PROTOCOL = pickle.DEFAULT_PROTOCOL  # ForkingPickler.dumps' (protocol=None)
# Kinds that stand in (a logger goes by its name; an array of objects is entered).
PAYLOADS = frozenset({"tensor", "array", "logger"})


class Inventory:
    """What a pass found: ``of(kind)``, the objects of that kind (each once, in
    the order met); ``unpicklable``, ``[(obj, exception)]`` (the first);
    ``complete``, whether the pass saw everything (else ``error``
    is what stopped it); ``met``, the ids of the objects that reached Python."""

    def __init__(self):
        self.found = {}
        self.unpicklable = []
        self.complete = True
        self.error = None
        self.objects = 0
        self.stand_ins = 0  # payloads written as nothing: the bytes are not a pickle
        self.met = set()

    def of(self, kind):
        return list(self.found.get(kind, {}).values())


def stand_in(*_args):
    """What a payload, or code sent by value, stands in as in a pass (never loaded)."""


class _Pass(pickle.Pickler):
    def __init__(self, inventory, table, code, sink=None):
        super().__init__(sink if sink is not None else NULL_SINK, PROTOCOL)
        self.keeping = sink is not None  # real bytes: arrays and loggers as pickle writes them
        self.inventory = inventory
        self.dispatch_table = table
        self.code = code  # (a class or function) -> NotImplemented, a reduction, an error

    def reducer_override(self, obj):
        if obj is stand_in:
            return NotImplemented  # the stand-ins' own function, by name
        inv = self.inventory
        inv.objects += 1
        inv.met.add(id(obj))
        cls = type(obj)
        kind = classify(cls)
        if kind is not None:
            inv.found.setdefault(kind, {})[id(obj)] = obj
            entered = kind == "array" and _object_array(obj)  # its objects are what it holds
            if kind in PAYLOADS and not entered:
                # A stand-in would hide the one payload torch refuses to send.
                if kind == "tensor" and getattr(obj, "requires_grad", False) \
                        and not obj.is_leaf:
                    raise _Stopped(obj, RuntimeError(
                        "Cowardly refusing to serialize non-leaf tensor which requires_grad, "
                        "since autograd does not support crossing process boundaries."))
                if not (self.keeping and kind != "tensor"):
                    inv.stand_ins += 1
                    return stand_in, ()
        if issubclass(cls, CODE):  # by its type: an object's __class__ is never asked
            sent = self.code(obj) if self.code is not None else NotImplemented
            if isinstance(sent, BaseException):
                raise _Stopped(obj, kept(sent))
            return sent
        reducer = self.dispatch_table.get(cls)
        try:
            return reducer(obj) if reducer is not None else obj.__reduce_ex__(PROTOCOL)
        except Exception as exc:  # what a worker's pickling would raise
            # Nothing further is asked to reduce: a lazy-module proxy would import its module.
            raise _Stopped(obj, kept(exc)) from None


class _Stopped(Exception):
    """A pass ends at its first failure (``(obj, exception)``), as pickling does."""


def _object_array(obj):
    with contextlib.suppress(Exception):
        return obj.dtype.hasobject
    return False


def take(obj, table, code=None, sink=None, known=()):
    """The ``Inventory`` of ``obj``; ``table``: the workers' dispatch table
    (``probe.sent_table``); ``code(obj)``, for a class or function:
    ``NotImplemented`` (by reference), a reduction (by value), or the exception
    a worker's pickling or loading of it would raise; ``sink``: where the pickle
    is written; ``known``: objects counted as pickled already (an ancestor)."""
    found = Inventory()
    pickler = _Pass(found, table, code, sink)
    pickler.memo = {id(a): (i, a) for i, a in enumerate(known)}
    spawning = context.get_spawning_popen()
    context.set_spawning_popen(ProbeSpawning())  # as while a child is started
    try:
        pickler.dump(obj)
    except _Stopped as stopped:
        found.unpicklable.append(stopped.args)
    except Exception as exc:  # too deep, or the pickler's own error: not complete
        found.complete = False
        found.error = kept(exc)
    finally:
        context.set_spawning_popen(spawning)
    return found


def sent_as_is(found):
    """Whether a pass's pickle may go as it is to every worker: it stood in
    nothing, and holds only plain data and numpy arrays (nothing pickled for one
    child at a time or made again by a repair: a tensor, a queue, a file, a lock)."""
    numpy = sys.modules.get("numpy")
    return found.complete and not found.unpicklable and not found.stand_ins \
        and set(found.found) <= {"array"} \
        and all(type(a) is numpy.ndarray for a in found.of("array"))  # not a memmap


class ProbeSpawning:
    """A child's Popen, set while multiprocessing pickles for it: Queues, Locks,
    Values and Connections pickle only then (``assert_spawning``). Nothing is
    duplicated: no child reads a pass."""

    @staticmethod
    def duplicate_for_child(fd):
        return fd

    class DupFd:
        def __init__(self, fd):
            self.fd = fd


def is_probing():
    return isinstance(context.get_spawning_popen(), ProbeSpawning)


def _sub(cls, module, name):
    other = loaded(module, name)
    return isinstance(other, type) and issubclass(cls, other)


# The kinds known by class, in the order asked: (kind, module, class name).
_KINDS = (("tensor", "torch", "Tensor"), ("tensor", "torch.storage", "TypedStorage"),
          ("tensor", "torch.storage", "UntypedStorage"), ("array", "numpy", "ndarray"),
          ("file", "io", "IOBase"), ("thread", "threading", "Thread"),
          ("pool", "concurrent.futures.thread", "ThreadPoolExecutor"),
          ("pool", "multiprocessing.pool", "ThreadPool"), ("logger", "logging", "Logger"),
          ("handler", "logging", "Handler"), ("socket", "socket", "socket"),
          ("mmap", "mmap", "mmap"), ("generator", "types", "GeneratorType"),
          ("image", "PIL.ImageFile", "ImageFile"))


@functools.cache
def classify(cls):
    """The kind of an object of ``cls`` a check wants to know of, or None
    (asked once per class, of the modules already imported)."""
    with contextlib.suppress(Exception):  # a class that cannot be looked at: nothing to note
        if issubclass(cls, (io.BytesIO, io.StringIO)):
            return None
        if issubclass(cls, (type(threading.Lock()), type(threading.RLock()), python_rlock() or ())):
            return "lock"
        kind = next((kind for kind, module, name in _KINDS if _sub(cls, module, name)), None)
        if kind is not None:
            return kind
        if issubclass(cls, CODE):
            return None  # classes, functions, modules: code, not what a dataset holds
        if getattr(cls, "__getattr__", None) is not None \
                or cls.__getattribute__ is not object.__getattribute__:
            return "forwarder"  # it may forward what unpickling asks: holdings.forwards_attributes
        module = getattr(cls, "__module__", "") or ""
        if module.split(".")[0] == "multiprocessing":
            return "process"  # a queue, a lock, a connection: pickled for one child at a time
        if module.split(".")[0] in ("h5py", "lmdb") or _sub(cls, "cv2", "VideoCapture") \
                or _sub(cls, "sqlite3", "Connection"):
            return "native"
    return None


MAX_DEPTH = 8
MAX_LOOKS = 24  # gc.get_referrers calls per name (each reads every tracked object)


def path_of(target, root, name):
    """``dataset.files[2].fh``: how ``root`` reaches ``target``, from ``target``
    back (``gc.get_referrers``), at most ``MAX_DEPTH`` steps and ``MAX_LOOKS``
    looks; None where not found (the caller names it by its kind)."""
    if target is root:
        return name
    frontier, seen, looks = [(target, "")], {id(target)}, [MAX_LOOKS]
    with contextlib.suppress(Exception):
        for _ in range(MAX_DEPTH):
            reached = []
            for node, suffix in frontier:
                if looks[0] <= 0:
                    return None
                for owner, label in _holders(node, looks):
                    if id(owner) in seen:
                        continue
                    seen.add(id(owner))
                    if owner is root:
                        return name + label + suffix
                    reached.append((owner, label + suffix))
            frontier = reached[:8]
    return None


def _holders(node, looks):
    """``(holder, label)`` for what holds ``node`` directly: an instance by an
    attribute, a list, tuple or dict."""
    found = []
    looks[0] -= 1
    for ref in gc.get_referrers(node):
        kind = type(ref)
        if issubclass(kind, (types.FrameType, types.FunctionType, type)):
            continue
        if issubclass(kind, dict):
            keys = [k for k, v in dict.items(ref) if v is node]
            owner = None
            if keys and all(type(k) is str for k in keys) and looks[0] > 0:
                looks[0] -= 1
                owner = next((o for o in gc.get_referrers(ref)
                              if instance_dict(o) is ref), None)
            found += [(owner, "." + k) if owner is not None else (ref, "[%r]" % (k,))
                      for k in keys]
        elif issubclass(kind, (list, tuple)):
            index = next((i for i, value in enumerate(ref) if value is node), None)
            if index is not None:
                found.append((ref, "[%d]" % index))
        else:
            attrs = instance_dict(ref)
            if attrs is not None:
                found += [(ref, "." + k) for k, v in dict.items(attrs)
                          if v is node and type(k) is str]
    return found
