"""First rung of the repair ladder: make the objects themselves fit for workers.

- A read-only regular file does not pickle, but it can travel by path: the
  reducers installed here reopen it in the receiving process at the same
  offset. Anything else (written files, pipes, sockets, closed or deleted
  files) still raises the TypeError it always did, so nothing whose state
  cannot be duplicated is duplicated.
- Under fork the dataset is not pickled, but every worker shares one OS file
  offset with the parent and its siblings: a dataset that seeks then reads
  returns other samples' bytes. ``reopen_files_in_worker`` gives each worker
  its own file.
- Lambdas, local functions and classes of an interactive ``__main__`` travel
  by value through cloudpickle.
- ``live_threading_objects`` names what makes fork unsafe: locks, threads
  and thread pools that a forked child inherits in whatever state they were.
"""

import io
import os
import stat
import sys
import threading
import weakref

from . import objwalk

PROTOCOL = __import__("pickle").DEFAULT_PROTOCOL
READONLY, WRITABLE = "readonly-file", "writable-file"

# -- file kinds ---------------------------------------------------------------


def _raw_file(f):
    """The FileIO under a text or buffered file, or None (BytesIO, gzip...)."""
    try:
        if isinstance(f, io.TextIOWrapper):
            f = f.buffer
        if isinstance(f, (io.BufferedReader, io.BufferedWriter, io.BufferedRandom)):
            f = f.raw
    except (ValueError, AttributeError):  # detached
        return None
    return f if isinstance(f, io.FileIO) else None


def _real_path(raw):
    """The path that opens this very file again, or None (deleted, moved, not regular)."""
    if raw.closed:
        return None
    try:
        fd = raw.fileno()
        here = os.fstat(fd)
        if not stat.S_ISREG(here.st_mode):
            return None
        candidates = []
        try:
            candidates.append(os.readlink("/proc/self/fd/%d" % fd))
        except OSError:
            pass
        if isinstance(raw.name, (str, bytes)):
            candidates.append(os.path.abspath(os.fsdecode(raw.name)))
        for path in candidates:
            try:
                there = os.stat(path)
            except OSError:
                continue
            if (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino):
                return path
    except (OSError, ValueError):
        pass
    return None


def _h5py_types():
    h5py = sys.modules.get("h5py")
    if h5py is None:
        return ()
    return tuple(getattr(h5py, n) for n in ("File", "Group", "Dataset") if hasattr(h5py, n))


def _h5py_kind(obj):
    try:
        if not obj.id.valid:
            return None
        f = obj.file
        if not os.path.isfile(f.filename):
            return None
        return READONLY if f.mode == "r" else WRITABLE
    except Exception:
        return None


def file_kind(f):
    """``"readonly-file"``, ``"writable-file"`` or None (not a regular file we can reopen).

    Read-only means opened for reading only (``'rb'``, ``'r'``, unbuffered or
    not) on a regular file that its path still names.
    """
    h5 = _h5py_types()
    if h5 and isinstance(f, h5):
        return _h5py_kind(f)
    raw = _raw_file(f)
    if raw is None or _real_path(raw) is None:
        return None
    if raw.writable():
        return WRITABLE
    return READONLY if raw.readable() else None


def _is_file_object(obj):
    if isinstance(obj, io.IOBase):
        return not isinstance(obj, (io.BytesIO, io.StringIO))
    h5 = _h5py_types()
    if h5 and isinstance(obj, h5):
        return True
    socket = sys.modules.get("socket")
    return socket is not None and isinstance(obj, socket.socket)


# -- reopening by path ----------------------------------------------------------


def _reopen_args(f):
    """What ``_reopen_file`` needs to open ``f`` again where it is, or None."""
    if file_kind(f) != READONLY:
        return None
    h5 = _h5py_types()
    if h5 and isinstance(f, h5):
        return ("h5py", f.file.filename, f.name, isinstance(f, sys.modules["h5py"].File))
    path = _real_path(_raw_file(f))
    try:
        offset = f.tell()  # a text file iterated with next() refuses: not now
    except (OSError, ValueError):
        return None
    if isinstance(f, io.TextIOWrapper):
        # The newline argument is not readable back: universal newlines assumed.
        return ("text", path, offset, f.encoding, f.errors)
    return ("raw" if isinstance(f, io.FileIO) else "binary", path, offset)


def _reopen_file(kind, *args):
    """Runs where the file arrives (a worker): the same file, at the same place."""
    if kind == "h5py":
        import h5py

        filename, name, whole = args
        f = h5py.File(filename, "r")
        return f if whole else f[name]
    path, offset = args[0], args[1]
    if kind == "raw":
        f = io.FileIO(path, "r")
    elif kind == "binary":
        f = open(path, "rb")
    else:
        f = open(path, "r", encoding=args[2], errors=args[3])
    f.seek(offset)
    return f


def reopen(f, offset=None):
    """A new file object on the same file, at ``offset`` (default: where ``f`` is)."""
    args = _reopen_args(f)
    if args is None:
        raise ValueError("not a read-only regular file: %r" % (f,))
    if offset is not None and args[0] != "h5py":
        args = args[:2] + (offset,) + args[3:]
    return _reopen_file(*args)


def _reduce_file(f):
    args = _reopen_args(f)
    if args is None:
        return f.__reduce_ex__(PROTOCOL)  # raises the very error it raised before us
    return _reopen_file, args


# -- by value -------------------------------------------------------------------


class ByValue:
    """A callable that pickles its function by value (cloudpickle).

    For a lambda or local function as collate_fn/worker_init_fn, or one
    defined in an interactive ``__main__``: plain pickle saves functions by
    name, which a worker cannot look up.
    """

    __slots__ = ("function", "__weakref__")

    def __init__(self, function):
        self.function = function

    def __call__(self, *args, **kwargs):
        return self.function(*args, **kwargs)

    def __reduce__(self):
        import cloudpickle

        return _load_by_value, (cloudpickle.dumps(self.function),)

    def __repr__(self):
        return "by_value(%r)" % (self.function,)


def _load_by_value(data):
    import cloudpickle

    return ByValue(cloudpickle.loads(data))


def by_value(fn):
    """``fn`` wrapped so that it travels by value; a wrapped one as it is."""
    return fn if isinstance(fn, ByValue) else ByValue(fn)


class _ClassByValue:
    """Stands in for a class in a reduce value; unpickles as that class."""

    __slots__ = ("cls",)

    def __init__(self, cls):
        self.cls = cls

    def __call__(self, *args, **kwargs):  # pickle requires the callable be callable
        return self.cls(*args, **kwargs)

    def __reduce__(self):
        import cloudpickle

        return cloudpickle.loads, (cloudpickle.dumps(self.cls),)


def _new_instance(cls, *args):
    return cls.__new__(cls, *args)


def _new_instance_ex(cls, args, kwargs):
    return cls.__new__(cls, *args, **kwargs)


def _reduce_instance_by_value(obj):
    """Only the class goes by value: the state still goes through ForkingPickler,
    so tensors are shared, not copied, and files use the reducers above."""
    import copyreg

    cls = type(obj)
    rv = obj.__reduce_ex__(PROTOCOL)
    if isinstance(rv, str):
        raise TypeError("cannot pickle %r by value" % (obj,))
    func, args, rest = rv[0], tuple(rv[1] or ()), tuple(rv[2:])
    if func is copyreg.__newobj__:
        func = _new_instance
    elif func is copyreg.__newobj_ex__:
        func = _new_instance_ex
    elif func is cls:
        func = _ClassByValue(cls)
    args = tuple(_ClassByValue(a) if a is cls else a for a in args)
    return (func, args) + rest


# -- registration ---------------------------------------------------------------

_MISSING = object()
_installed = {}  # type -> the reducer it had before us (or _MISSING)


def _register(cls, reducer):
    from multiprocessing.reduction import ForkingPickler

    if cls not in _installed:
        _installed[cls] = ForkingPickler._extra_reducers.get(cls, _MISSING)
    ForkingPickler.register(cls, reducer)


def install_reducers():
    """Let read-only files (and h5py objects, if h5py is imported) travel by path.

    Idempotent; call again after h5py is imported to cover it too.
    """
    for cls in (io.FileIO, io.BufferedReader, io.TextIOWrapper) + _h5py_types():
        _register(cls, _reduce_file)


def register_by_value_class(cls):
    """Instances of ``cls`` (from an interactive ``__main__``) travel with their class."""
    _register(cls, _reduce_instance_by_value)


def uninstall_reducers():
    """Put back what ForkingPickler had before any registration made here."""
    from multiprocessing.reduction import ForkingPickler

    for cls, previous in _installed.items():
        if previous is _MISSING:
            ForkingPickler._extra_reducers.pop(cls, None)
        else:
            ForkingPickler._extra_reducers[cls] = previous
    _installed.clear()


# -- finding what a dataset holds ----------------------------------------------


class Found(tuple):
    """``(path, obj, kind)``; ``.edge`` knows where it hangs, ``.set(new)`` replaces it."""

    def __new__(cls, path, obj, kind, edge):
        self = tuple.__new__(cls, (path, obj, kind))
        self.edge = edge
        return self

    path = property(lambda self: self[0])
    obj = property(lambda self: self[1])
    kind = property(lambda self: self[2])

    @property
    def settable(self):
        return self.edge is not None and self.edge.settable

    def set(self, new):
        if self.edge is None:
            raise TypeError("the root object cannot be replaced in place")
        self.edge.set(new)


def find_files(obj, path="dataset", items=None):
    """Files reachable from ``obj``: ``Found(path, file, file_kind(file))``.

    Includes files that cannot be reopened (kind None: pipes, sockets, closed
    or deleted files). A file held in two places is reported at each.
    ``items``: look at that many items per container (``objwalk.SAMPLE_ITEMS``).
    """
    if _is_file_object(obj):
        return [Found(path, obj, file_kind(obj), None)]
    found, kinds = [], {}
    for here, owner, _edge in objwalk.walk(obj, path, stop=_stop_at, items=items):
        if _stop_at(owner):
            continue
        try:
            edges = list(objwalk.edges(owner, items))
        except Exception:
            continue
        for edge in edges:
            child = edge.child
            if _is_file_object(child):
                if id(child) not in kinds:
                    kinds[id(child)] = file_kind(child)
                found.append(Found(here + edge.label(), child, kinds[id(child)], edge))
    return found


_THREADING_KINDS = None


def _threading_kinds():
    global _THREADING_KINDS
    if _THREADING_KINDS is None:
        kinds = [(type(threading.Lock()), "lock"), (type(threading.RLock()), "rlock")]
        if hasattr(threading, "_PyRLock"):
            kinds.append((threading._PyRLock, "rlock"))
        kinds += [(threading.Condition, "condition"), (threading.Semaphore, "semaphore"),
                  (threading.Event, "event"), (threading.Barrier, "barrier"),
                  (threading.Thread, "thread")]
        _THREADING_KINDS = tuple(kinds)
    return _THREADING_KINDS


def _thread_pool_in_use(obj):
    futures = sys.modules.get("concurrent.futures.thread")
    if futures is not None and isinstance(obj, futures.ThreadPoolExecutor):
        return bool(getattr(obj, "_threads", ()))
    pool = sys.modules.get("multiprocessing.pool")
    if pool is not None and isinstance(obj, pool.ThreadPool):
        return bool(getattr(obj, "_pool", ())) and getattr(obj, "_state", None) == "RUN"
    return None  # not a thread pool


def _threading_kind(obj):
    for cls, kind in _threading_kinds():
        if isinstance(obj, cls):
            return kind
    return None


def _stop_at(obj):
    """Objects the walks report but never enter."""
    if _is_file_object(obj) or _threading_kind(obj) is not None \
            or _thread_pool_in_use(obj) is not None:
        return True
    logging = sys.modules.get("logging")  # its locks are re-made after fork by logging
    return logging is not None and isinstance(obj, (logging.Logger, logging.Handler))


def live_threading_objects(obj, path="dataset", items=objwalk.SAMPLE_ITEMS):
    """``(path, kind)`` for locks, live threads and used thread pools ``obj`` holds.

    A forked worker inherits each in the state it had at fork: a lock another
    thread held stays held forever, a thread pool has no threads behind it.
    """
    found = []
    for here, value, _edge in objwalk.walk(obj, path, stop=_stop_at, items=items):
        in_use = _thread_pool_in_use(value)
        if in_use is not None:
            if in_use:
                found.append((here, "thread-pool"))
            continue
        kind = _threading_kind(value)
        if kind == "thread" and not value.is_alive():
            continue
        if kind is not None:
            found.append((here, kind))
    return found


# -- per-worker reopening -------------------------------------------------------

_parent_offsets = {}  # id(file) -> (weakref to it, offset)


def remember_file_offsets(obj, path="dataset"):
    """Record, in the parent, where each read-only file stands before forking.

    Forked workers share the OS offset, so a worker that starts late would
    read a sibling's position with tell(); it uses the recorded one instead.
    """
    for found in find_files(obj, path):
        if found.kind == READONLY and not isinstance(found.obj, _h5py_types() or ()):
            try:
                _parent_offsets[id(found.obj)] = (weakref.ref(found.obj), found.obj.tell())
            except (OSError, ValueError, TypeError):
                pass


def reopen_files(obj, path="dataset"):
    """Replace each read-only file reachable from ``obj`` by a fresh one, in place.

    Returns the paths replaced. A file held only in a tuple cannot be replaced
    and is left as it is. The old file objects are not closed: something
    outside ``obj`` may still use them.
    """
    fresh, replaced = {}, []
    for found in find_files(obj, path):
        if found.kind != READONLY or not found.settable:
            continue
        old = found.obj
        if id(old) not in fresh:
            remembered = _parent_offsets.get(id(old))
            offset = remembered[1] if remembered and remembered[0]() is old else None
            try:
                fresh[id(old)] = reopen(old, offset)
            except (OSError, ValueError):
                continue
        found.set(fresh[id(old)])
        replaced.append(found.path)
    return replaced


def reopen_files_in_worker(worker_id):
    """A worker_init step: this worker's own copy of every read-only file of its dataset."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is not None:
        reopen_files(info.dataset)
