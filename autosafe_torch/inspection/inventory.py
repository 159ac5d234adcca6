"""One pass over what a loader's parts hold, at C speed: the inventory.

The pickler is the walker: containers and plain values (str, int, float,
bytes) are traversed in C, with no Python call per item (an ImageNet index
of 1.28M ``(path, class)`` tuples costs what pickling it costs, well under a
second, where a Python walk took some 25 us an object). Every other object
reaches ``reducer_override``, which notes it by kind (``classify``, once per
class) and tells the pickler what to enter:

- ``HELD`` (what a forked worker inherits): every attribute of every object
  (``__dict__``, ``__slots__``, a container subclass's items), whatever its
  own pickling says; code, payloads and handles are not entered.
- ``SENT`` (what a spawned worker receives): what pickling sends, with the
  dispatch table given (ForkingPickler's reducers, the planned repairs'). The
  first object that does not pickle, the innermost on its path, is noted
  (``unpicklable``) and the pass of that part ends there, as pickling does.

Nothing is capped or sampled: the pass sees everything, or says it did not
(``complete`` False: a RecursionError, the pickler's own error), and a check
decides as for a hazard it cannot rule out. Nothing is written or loaded. No
user code runs but ``__reduce__``/``__getstate__`` in ``SENT`` mode, as
torch's own pickling for a worker runs them. ``path_of`` names what was
found, from the object back (``gc.get_referrers``), only for what a check
acts on: the healthy path names nothing.
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
from .slots import slot_names

PROTOCOL = pickle.DEFAULT_PROTOCOL  # ForkingPickler.dumps' (protocol=None)
HELD, SENT = "held", "sent"

# Kinds whose objects are noted and not entered (HELD): payloads and handles
# (what they hold is theirs, or C's), and a logger (it reaches the whole logging
# tree). In SENT mode only payloads are not entered (their bytes say nothing of
# pickling, and a logger goes by its name): the rest is pickled as pickle would.
OPAQUE = frozenset({"tensor", "array", "file", "lock", "thread", "socket", "native", "mmap",
                    "generator", "logger"})
PAYLOADS = frozenset({"tensor", "array", "logger"})


class _Everything:
    """A ``watch`` that every object is in: ``met`` is all the pass reached."""

    def __contains__(self, _key):
        return True


EVERYTHING = _Everything()


class Inventory:
    """What a pass found: ``of(kind)``, the objects of that kind (each once, in
    the order met); ``unpicklable``, ``[(obj, exception)]`` (``SENT``: the
    first of each part); ``complete``, whether the pass saw everything (else
    ``error`` says why); ``objects``, how many objects reached Python (not
    counting plain values and containers)."""

    __slots__ = ("mode", "found", "unpicklable", "complete", "error", "objects", "stand_ins",
                 "met")

    def __init__(self, mode):
        self.mode = mode
        self.found = {}
        self.unpicklable = []
        self.complete = True
        self.error = None
        self.objects = 0
        self.stand_ins = 0  # payloads written as nothing (SENT): the bytes are not a pickle
        self.met = set()  # the ids of ``watch`` objects the pass reached

    def of(self, kind):
        return list(self.found.get(kind, {}).values())


class NullSink:
    __slots__ = ()

    def write(self, data):
        return len(data)


def _nothing(*_args):
    """What an object stands in as in a pass (never loaded)."""


_CODE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type,
         types.ModuleType, types.CodeType, types.FrameType)
_kinds = {}  # class -> kind or None: classify's answers


class _Pass(pickle.Pickler):
    def __init__(self, inventory, table, code, sink=None, watch=frozenset()):
        super().__init__(sink if sink is not None else NullSink(), PROTOCOL)
        self.watch = watch
        self.keeping = sink is not None  # real bytes: arrays and loggers as pickle writes them
        self.inventory = inventory
        if table is not None:
            self.dispatch_table = table
        self.table = table or {}
        self.code = code  # SENT: (a class or function) -> NotImplemented, a reduction, an error

    def reducer_override(self, obj):
        if obj is _nothing:
            return NotImplemented  # the stand-ins' own function, by name
        inv = self.inventory
        inv.objects += 1
        if id(obj) in self.watch:
            inv.met.add(id(obj))
        cls = type(obj)
        kind = _kinds.get(cls, _UNSET)
        if kind is _UNSET:
            kind = _kinds[cls] = classify(cls)
        if kind is not None:
            inv.found.setdefault(kind, {})[id(obj)] = obj
            entered = kind == "array" and _object_array(obj)  # its objects are what it holds
            if inv.mode == HELD and kind in OPAQUE and not entered:
                return _nothing, ()
            if inv.mode == SENT and kind in PAYLOADS and not entered:
                # What a stand-in would hide of a payload: the tensor torch refuses
                # to send (a logger goes by its name, an array by its bytes).
                if kind == "tensor" and getattr(obj, "requires_grad", False) \
                        and not obj.is_leaf:
                    inv.unpicklable.append((obj, RuntimeError(
                        "Cowardly refusing to serialize non-leaf tensor which requires_grad, "
                        "since autograd does not support crossing process boundaries.")))
                    raise _Stopped
                if not (self.keeping and kind != "tensor"):
                    inv.stand_ins += 1
                    return _nothing, ()
        if issubclass(cls, _CODE):  # by its type: an object's __class__ is never asked
            if inv.mode == HELD:
                return _nothing, ()
            sent = self.code(obj) if self.code is not None else NotImplemented
            if isinstance(sent, BaseException):
                inv.unpicklable.append((obj, kept(sent)))
                raise _Stopped
            return sent
        if inv.mode == HELD:
            return _held_reduction(obj)
        reducer = self.table.get(cls)
        try:
            return reducer(obj) if reducer is not None else obj.__reduce_ex__(PROTOCOL)
        except Exception as exc:  # what a worker's pickling would raise
            inv.unpicklable.append((obj, kept(exc)))
            # Nothing further is asked to reduce: a lazy-module proxy would import its module.
            raise _Stopped from None


class _Stopped(Exception):
    """A ``SENT`` pass ends at its first failure, as pickling does."""


_UNSET = object()


def _object_array(obj):
    try:
        return obj.dtype.hasobject
    except Exception:
        return False


def _held_reduction(obj):
    """A reduction that makes the pickler enter every attribute ``obj`` holds
    (and a container subclass's items), whatever its own pickling says."""
    slots = []
    for name in slot_names(type(obj)):
        try:
            slots.append(object.__getattribute__(obj, name))
        except Exception:
            continue
    items = None
    try:
        for base in (dict, list, tuple, set, frozenset):
            if issubclass(type(obj), base):
                # The built-in's: a subclass's own is user code.
                items = list(dict.items(obj) if base is dict else base.__iter__(obj))
                break
    except Exception:
        items = None
    return _nothing, (tuple(slots), items), _instance_dict(obj)


def take(parts, mode, table=None, code=None, sink=None, watch=frozenset()):
    """The ``Inventory`` of ``parts`` (``{name: part}``, None parts skipped) in
    ``mode``; ``table``: the dispatch table; ``code(obj)``, for a class or
    function (``SENT``): ``NotImplemented`` (by reference), a reduction (by
    value), or the exception a worker's pickling or loading of it would raise.
    ``sink`` (``SENT``, one part): where the pickle is written (only tensors
    stand in: ``stand_ins``). ``watch``: ids of objects whose meeting the pass
    notes (``met``)."""
    found = Inventory(mode)
    with _spawning() if mode == SENT else contextlib.nullcontext():
        for name, part in parts.items():
            if part is None:
                continue
            try:
                _Pass(found, table, code, sink, watch).dump(part)
            except _Stopped:
                continue  # its failure is noted (unpicklable)
            except Exception as exc:  # too deep, or the pickler's own error: not complete
                found.complete = False
                found.error = "%s: %s (%s)" % (name, type(exc).__name__, exc)
    return found


@contextlib.contextmanager
def _spawning():
    """As while a child is started: Queues, Locks, Connections pickle only then."""
    spawning = context.get_spawning_popen()
    context.set_spawning_popen(ProbeSpawning())
    try:
        yield
    finally:
        context.set_spawning_popen(spawning)


def first_error(obj, table, code, known=()):
    """``(exception, objects)``: what a worker's pickling of ``obj`` raises
    first (None: it pickles), as a ``SENT`` pass finds it, and how many
    objects the pass met. ``known``: objects counted as pickled already (an
    ancestor of ``obj``, where a failure is located part by part)."""
    found = Inventory(SENT)
    pickler = _Pass(found, table, code)
    pickler.memo = {id(a): (i, a) for i, a in enumerate(known)}
    with _spawning():
        try:
            pickler.dump(obj)
            return None, found.objects
        except _Stopped:
            return found.unpicklable[0][1], found.objects
        except Exception as exc:  # too deep, or the pickler's own error
            return kept(exc), found.objects


def sent_as_is(found):
    """Whether a ``SENT`` pass's pickle may go, as it is, to every worker: it
    stood in nothing, and holds nothing pickled for one child at a time or
    made again by a repair (tensors to shared memory, a queue's descriptors, a
    file, a lock, a logger): plain data, numpy arrays included."""
    numpy = sys.modules.get("numpy")
    return found.complete and not found.unpicklable and not found.stand_ins \
        and set(found.found) <= {"array"} \
        and all(type(a) is numpy.ndarray for a in found.of("array"))  # not a memmap


class _NotPlain(Exception):
    pass


class _PlainOnly(pickle.Pickler):
    def reducer_override(self, obj):
        raise _NotPlain


def only_plain(container):
    """Whether ``container`` holds plain values only: numbers, strings, bytes,
    None and built-in containers of them (the pickler reads those in C and
    calls back for anything else, which stops it)."""
    try:
        _PlainOnly(NullSink(), PROTOCOL).dump(container)
    except Exception:  # _NotPlain; or too deep, a cycle the memo would take: not known plain
        return False
    return True


class ProbeSpawning:
    """Stands in for the Popen of a child being started, as multiprocessing sets
    one while it pickles for the child: Queues, Locks, Semaphores, Values and
    Connections then pickle (``assert_spawning``), as they do at process start.
    Nothing is duplicated: a pass writes nowhere a child reads."""

    @staticmethod
    def duplicate_for_child(fd):
        return fd

    class DupFd:
        def __init__(self, fd):
            self.fd = fd


def is_probing():
    """Whether what is being pickled now goes to a pass, not to a child."""
    return isinstance(context.get_spawning_popen(), ProbeSpawning)


# -- what a kind is ------------------------------------------------------------

def classify(cls):
    """The kind of an object of ``cls`` a check wants to know of, or None.
    Asked once per class; the modules asked are those already imported."""
    try:
        return _classify(cls)
    except Exception:  # a class that cannot be looked at: nothing to note
        return None


def _sub(cls, module, name):
    holder = sys.modules.get(module)
    other = getattr(holder, name, None) if holder is not None else None
    return isinstance(other, type) and issubclass(cls, other)


# The kinds known by class, in the order asked: (kind, module, class name).
_KINDS = (("tensor", "torch", "Tensor"), ("array", "numpy", "ndarray"), ("file", "io", "IOBase"),
          ("thread", "threading", "Thread"),
          ("pool", "concurrent.futures.thread", "ThreadPoolExecutor"),
          ("pool", "multiprocessing.pool", "ThreadPool"), ("logger", "logging", "Logger"),
          ("handler", "logging", "Handler"), ("socket", "socket", "socket"),
          ("mmap", "mmap", "mmap"), ("generator", "types", "GeneratorType"),
          ("image", "PIL.ImageFile", "ImageFile"))


def _classify(cls):
    if issubclass(cls, (io.BytesIO, io.StringIO)):
        return None
    if issubclass(cls, _lock_types()):
        return "lock"
    kind = next((kind for kind, module, name in _KINDS if _sub(cls, module, name)), None)
    if kind is not None:
        return kind
    if issubclass(cls, _CODE):
        return None  # classes, functions, modules: code, not what a dataset holds
    if getattr(cls, "__getattr__", None) is not None \
            or cls.__getattribute__ is not object.__getattribute__:
        return "forwarder"  # it may forward what unpickling asks it: holdings.forwards_attributes
    module = getattr(cls, "__module__", "") or ""
    if module.split(".")[0] == "multiprocessing":
        return "process"  # a queue, a lock, a connection: pickled for one child at a time
    if module.split(".")[0] in ("h5py", "lmdb") or _sub(cls, "cv2", "VideoCapture") \
            or _sub(cls, "sqlite3", "Connection"):
        return "native"
    return None


@functools.lru_cache(maxsize=1)
def _lock_types():
    kinds = (type(threading.Lock()), type(threading.RLock()))
    return kinds + ((python_rlock(),) if python_rlock() is not None else ())


# -- naming what was found --------------------------------------------------------

MAX_DEPTH = 8
MAX_LOOKS = 24  # gc.get_referrers calls per name (each reads every tracked object)


def path_of(target, parts):
    """``dataset.files[2].fh``: how ``parts`` (``{name: part}``) reach ``target``,
    looked for from ``target`` back (``gc.get_referrers``: what holds it, then
    what holds that), at most ``MAX_DEPTH`` steps and ``MAX_LOOKS`` looks;
    None where not found (the caller names it by its kind)."""
    roots = {id(part): name for name, part in parts.items() if part is not None}
    if id(target) in roots:
        return roots[id(target)]
    frontier, seen, looks = [(target, "")], {id(target)}, [MAX_LOOKS]
    try:
        for _ in range(MAX_DEPTH):
            reached = []
            for node, suffix in frontier:
                if looks[0] <= 0:
                    return None
                for owner, label in _holders(node, looks):
                    if id(owner) in seen:
                        continue
                    seen.add(id(owner))
                    if id(owner) in roots:
                        return roots[id(owner)] + label + suffix
                    reached.append((owner, label + suffix))
            if not reached:
                return None
            frontier = reached[:8]
    except Exception:
        return None
    return None


def _holders(node, looks):
    """``(holder, label)`` for what holds ``node`` directly: an instance by an
    attribute (through its ``__dict__``, or inline), a list, tuple or dict."""
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
                              if _instance_dict(o) is ref), None)
            if owner is not None:
                found += [(owner, "." + k) for k in keys]
            else:
                found += [(ref, "[%r]" % (k,)) for k in keys]
        elif issubclass(kind, (list, tuple)):
            for index, value in enumerate(ref):
                if value is node:
                    found.append((ref, "[%d]" % index))
                    break
        else:
            attrs = _instance_dict(ref)
            if attrs is not None:
                found += [(ref, "." + k) for k, v in dict.items(attrs)
                          if v is node and type(k) is str]
    return found


def _instance_dict(obj):
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except Exception:
        return None
    return attrs if type(attrs) is dict else None
