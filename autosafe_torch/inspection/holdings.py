"""What a dataset holds that matters to its workers: files (h5py, lmdb and
recorded cv2 captures count), locks, thread pools, loggers; looked at, never
changed, no user code run (``remedies`` acts on it).
"""

import collections
import contextlib
import functools
import io
import logging
import os
import stat
import sys
import threading
import types

from .. import callsite
from ..mp_private import (executor_threads, locks_inside, pool_running, python_rlock,
                          rlock_owned)
from . import objwalk
from .objwalk import is_a

READONLY, WRITABLE = "readonly-file", "writable-file"
BUFFERED = (io.BufferedReader, io.BufferedWriter, io.BufferedRandom)

# -- file kinds ---------------------------------------------------------------


def raw_file(f):
    """The FileIO under a text or buffered file, or None (BytesIO, gzip...)."""
    try:
        if is_a(f, io.TextIOWrapper):
            f = f.buffer
        if is_a(f, BUFFERED):
            f = f.raw
    except (ValueError, AttributeError):  # detached
        return None
    return f if is_a(f, io.FileIO) else None


def real_path(raw):
    """The path that opens this very file again, or None (deleted, moved, not regular)."""
    if raw.closed:
        return None
    with contextlib.suppress(OSError, ValueError):
        fd = raw.fileno()
        here = os.fstat(fd)
        if not stat.S_ISREG(here.st_mode):
            return None
        candidates = []
        with contextlib.suppress(OSError):
            candidates.append(os.readlink("/proc/self/fd/%d" % fd))
        if isinstance(raw.name, (str, bytes)):
            candidates.append(os.path.abspath(os.fsdecode(raw.name)))
        for path in candidates:
            with contextlib.suppress(OSError):
                if os.path.samestat(os.stat(path), here):
                    return path
    return None


def loaded(module, name):
    """``module.name`` where the program imported ``module``, else None (``is_a``
    of None is False): nothing is imported for a look."""
    return getattr(sys.modules.get(module), name, None)


def h5py_types():
    return tuple(c for n in ("File", "Group", "Dataset") if (c := loaded("h5py", n)) is not None)


# -- native handles -------------------------------------------------------------

# id of each cv2.VideoCapture -> ``(source, apiPreference, params)`` (cv2 patch): by
# id, as a capture takes no attributes or weak references; oldest dropped first.
_video_sources = collections.OrderedDict()
MAX_VIDEO_SOURCES = 4096


def remember_video_source(cap, source):
    _video_sources.pop(id(cap), None)
    _video_sources[id(cap)] = source
    while len(_video_sources) > MAX_VIDEO_SOURCES:
        _video_sources.popitem(last=False)


LMDB_ENV, LMDB_DB, VIDEO = "lmdb environment", "lmdb database handle", "cv2.VideoCapture"
LMDB = (LMDB_ENV, LMDB_DB)  # py-lmdb opens each once per process: never reopened in this one


def fork_unsafe(obj):
    """The kind of native handle a forked child must not use, else None: LMDB
    forbids one after fork; a capture that decoded in the parent hangs forked
    workers (FFmpeg's threads stay behind)."""
    if is_a(obj, loaded("lmdb", "Environment")):
        return LMDB_ENV
    if "lmdb" in sys.modules and type(obj).__name__ == "_Database" \
            and type(obj).__module__ in ("builtins", "lmdb.cffi"):
        return LMDB_DB
    return VIDEO if is_a(obj, loaded("cv2", "VideoCapture")) else None


def video_source(cap):
    """``(path, apiPreference, params)`` of an open capture of a regular file the
    patch recorded, else None (a camera, a stream, closed, made before the patch)."""
    with contextlib.suppress(Exception):
        source = _video_sources.get(id(cap))
        if source is not None and isinstance(source[0], str) and os.path.isfile(source[0]) \
                and cap.isOpened():
            return source
    return None


def file_kind(f):
    """``READONLY``, ``WRITABLE`` or None (not a regular file we can reopen); a
    sqlite connection, lmdb environment or recorded capture is reopened read-only."""
    if is_a(f, h5py_types()):
        with contextlib.suppress(Exception):
            h5file = f.file if f.id.valid else None
            if h5file is not None and os.path.isfile(h5file.filename):
                return READONLY if h5file.mode == "r" else WRITABLE
        return None
    if sqlite_path(f) is not None:
        return READONLY
    handle = fork_unsafe(f)
    if handle is not None:  # an lmdb database handle is tied to its environment: None
        with contextlib.suppress(Exception):  # a closed environment
            if handle == LMDB_ENV and os.path.exists(f.path()) \
                    or handle == VIDEO and video_source(f) is not None:
                return READONLY
        return None
    raw = raw_file(f)
    if raw is None or real_path(raw) is None:
        return None
    if raw.writable():
        return WRITABLE
    return READONLY if raw.readable() else None


def sqlite_path(conn):
    """The database file of a sqlite3 connection that could be reopened by path
    (one database, on a regular file, no transaction open), else None."""
    if not is_a(conn, loaded("sqlite3", "Connection")):
        return None
    try:
        if conn.in_transaction:
            return None
        databases = conn.execute("PRAGMA database_list").fetchall()
    except Exception:  # closed, or used from its own thread only
        return None
    path = databases[0][2] if len(databases) == 1 else None
    return path if path and os.path.isfile(path) else None


def is_native_handle(obj):
    """A forked child needs its own, and it has no descriptor to give."""
    return is_a(obj, h5py_types()) or fork_unsafe(obj) is not None


def is_file_object(obj):
    if is_a(obj, io.IOBase):
        return not is_a(obj, (io.BytesIO, io.StringIO))
    return is_native_handle(obj) or is_a(obj, loaded("socket", "socket"))


# -- finding what a dataset holds ----------------------------------------------


class HeldFile(collections.namedtuple("HeldFile", "path obj kind")):
    """``.set(new)`` replaces it where it hangs (``.edge``)."""

    def __new__(cls, path, obj, kind, edge):
        self = super().__new__(cls, path, obj, kind)
        self.edge = edge
        return self

    @property
    def settable(self):
        return self.edge is not None and self.edge.settable

    @property
    def fork_unsafe(self):
        return fork_unsafe(self.obj)

    def set(self, new):
        if self.edge is None:
            raise TypeError("the root object cannot be replaced in place")
        self.edge.set(new)


def find_files(obj, path="dataset"):
    """A ``HeldFile`` at each place ``obj`` holds a file (kind None: pipes,
    sockets, closed or deleted files)."""
    if is_file_object(obj):
        return [HeldFile(path, obj, file_kind(obj), None)]
    found, kinds = [], {}
    for here, owner, _edge in objwalk.walk(obj, path, stop=stop_at):
        if stop_at(owner):
            continue
        try:
            edges = list(objwalk.edges(owner))
        except Exception:
            continue
        for edge in edges:
            child = edge.child
            with contextlib.suppress(Exception):  # an object that cannot be looked at: skipped
                if is_file_object(child):
                    if id(child) not in kinds:
                        kinds[id(child)] = file_kind(child)
                    found.append(HeldFile(here + edge.label(), child, kinds[id(child)], edge))
    return found


@functools.cache
def _threading_kinds():
    kinds = [(type(threading.Lock()), "lock"), (type(threading.RLock()), "rlock")]
    if python_rlock() is not None:
        kinds.append((python_rlock(), "rlock"))
    return tuple(kinds) + ((threading.Condition, "condition"), (threading.Semaphore, "semaphore"),
                           (threading.Event, "event"), (threading.Barrier, "barrier"),
                           (threading.Thread, "thread"))


def thread_pool_in_use(obj):
    if is_a(obj, loaded("concurrent.futures.thread", "ThreadPoolExecutor")):
        return bool(executor_threads(obj))
    if is_a(obj, loaded("multiprocessing.pool", "ThreadPool")):
        return pool_running(obj)
    return None  # not a thread pool


def find_thread_pools(obj, path="dataset"):
    return [(here, value, edge) for here, value, edge in objwalk.walk(obj, path, stop=stop_at)
            if thread_pool_in_use(value) is not None]


def threading_kind(obj):
    for cls, kind in _threading_kinds():
        if is_a(obj, cls):
            return kind
    return None


def stop_at(obj):
    """Files, locks, threads, pools and loggers: reported, never entered."""
    return is_file_object(obj) or stop_at_threading(obj)


def stop_at_threading(obj):
    """``stop_at`` less files (a logger reaches the whole logging tree; logging
    re-makes its locks after fork)."""
    return threading_kind(obj) is not None or thread_pool_in_use(obj) is not None \
        or is_a(obj, (logging.Logger, logging.Handler))


def fork_blockers(obj, path="dataset"):
    """``(path, kind)`` for what a forked worker cannot inherit: a lock held now
    (by any thread: in the child it stays held forever), a live thread (the
    child has none behind it). An unheld lock is copied unheld; a thread pool
    is rebuilt in each worker (DL208)."""
    found = []
    for here, value, _edge in objwalk.walk(obj, path, stop=stop_at):
        kind = threading_kind(value)
        if kind == "thread" and value.is_alive():
            found.append((here, "live thread"))
        elif kind not in (None, "thread") and held(value):
            found.append((here, "held %s" % kind))
    return found


def held(obj):
    """Whether a lock (or the one under a primitive) is held now, by any thread;
    unknown: held."""
    with contextlib.suppress(Exception):
        for inner in locks_inside(objwalk.instance_dict(obj) or {}):  # a lock has no __dict__
            if threading_kind(inner) is not None:
                return held(inner)
        if is_a(obj, type(threading.Lock())):
            return obj.locked()
        if threading_kind(obj) == "rlock":
            if not obj.acquire(blocking=False):
                return True  # another thread holds it
            obj.release()
            return rlock_owned(obj)  # this thread held it before
    return True


def unheld_lock(value):
    """A lock (or a primitive around one) nobody holds now: it travels."""
    return threading_kind(value) not in (None, "thread") and not held(value)


def users_locks(parts, lock):
    """``(path, obj)`` of each outermost unheld lock the user's own objects hold
    in ``parts`` (through primitives and containers too), where ``lock`` is one."""
    if not unheld_lock(lock):
        return None
    owners = objwalk.Owners(parts)

    def users(obj):
        owner = owners.owner(obj)
        while owner is not None and (threading_kind(owner) is not None
                                     or is_a(owner, objwalk.CONTAINERS)):
            owner = owners.owner(owner)
        return owner is not None and users_class(type(owner))

    if not users(lock):
        return None
    return [(here, obj) for here, obj in owners.met if unheld_lock(obj)
            and users(obj) and threading_kind(owners.owner(obj)) is None]


def users_module(name):
    """The script, or a file outside the installed and standard libraries."""
    if name in ("__main__", "__mp_main__"):
        return True
    path = getattr(sys.modules.get(name), "__file__", None)
    return bool(path and not os.path.realpath(path).startswith(callsite.installed_dirs()))


def users_class(cls):
    return users_module(getattr(cls, "__module__", ""))


# -- loggers and their handlers --------------------------------------------------

_STDIO = ("stdout", "stderr")


def _stdio_name(stream):
    for name in _STDIO:
        if stream is getattr(sys, name, None) or stream is getattr(sys, "__%s__" % name, None):
            return name
    return None


def rebuildable(obj):
    """A file handler, or a stream handler on stdout/stderr, pickled by default."""
    if not isinstance(obj, logging.Handler) or type(obj).__reduce_ex__ \
            is not object.__reduce_ex__ or "__getstate__" in vars(type(obj)):
        return False
    if isinstance(obj, logging.FileHandler):
        return True
    return isinstance(obj, logging.StreamHandler) and \
        _stdio_name(getattr(obj, "stream", None)) is not None


def holding(owners, value):
    """``(path, handler)`` where ``value`` is, or is held by, a ``rebuildable``
    handler (``owners``: ``objwalk.Owners``), else None."""
    for here, obj in owners.chain(value):
        if isinstance(obj, logging.Handler):
            return (here, obj) if rebuildable(obj) else None
    return None


def chain(logger):
    while logger is not None:
        yield logger
        logger = logger.parent if logger.propagate else None


def configured(logger):
    """Whether ``logger``'s chain has a handler, level, filter, ``propagate`` off or
    ``disabled`` on, which a spawned worker lacks (the root's WARNING it has)."""
    return any(link.handlers or link.filters or link.disabled or not link.propagate
               or link.level != (logging.WARNING if link is logging.root else logging.NOTSET)
               for link in chain(logger))


def forwards_attributes(obj):
    """An instance whose class forwards unknown attributes and pickles and copies
    by default, where asking the new, empty instance for ``__setstate__``
    recurses or raises (a RecursionError in a spawned worker): rebuilt from its
    ``__dict__``."""
    cls = type(obj)
    defaults = (("__reduce_ex__", object.__reduce_ex__), ("__reduce__", object.__reduce__),
                ("__getstate__", getattr(object, "__getstate__", None)),
                ("__setstate__", None), ("__deepcopy__", None),
                ("__getnewargs__", None), ("__getnewargs_ex__", None))
    with contextlib.suppress(Exception):
        forwards = getattr(cls, "__getattr__", None) is not None \
            or cls.__getattribute__ is not object.__getattribute__
        if not forwards or objwalk.slot_names(cls) \
                or issubclass(cls, (list, dict, set, frozenset, tuple)) \
                or objwalk.instance_dict(obj) is None \
                or not all(getattr(cls, name, None) is default for name, default in defaults):
            return False
        # Its own __getattribute__ answers every look-up: never asked here.
        return cls.__getattribute__ is not object.__getattribute__ or _unpickling_fails(cls)
    return False


@functools.cache
def _unpickling_fails(cls):
    """Whether that question fails (transformers' tokenizers raise AttributeError):
    asked once per class, only of what workers are sent."""
    try:
        empty = cls.__new__(cls)  # as copyreg.__newobj__ makes it
    except Exception:  # pickle's own error, as without the shim
        return False
    try:
        getattr(empty, "__setstate__", None)
    except Exception:  # RecursionError, or the forwarder's own error
        return True
    return False


# -- code that already takes care of itself ------------------------------------


PER_PROCESS_NAMES = frozenset({"getpid", "pread", "preadv"})


def nested_code(code, depth=0):
    yield code
    if depth < 4:
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from nested_code(const, depth + 1)


def reopens_per_process(obj):
    """Whether the methods of ``obj``'s own classes ask ``os.getpid()`` (reopening
    per process) or use ``os.pread``/``preadv`` (no shared offset): read, never run."""
    for cls in type(obj).__mro__:
        if cls.__module__ == "builtins" or cls.__module__.startswith("torch."):
            continue
        for value in vars(cls).values():
            # Only functions' code is read: another attribute's access may be user code.
            func = value.__func__ if type(value) in (staticmethod, classmethod) else value
            if type(func) is types.FunctionType \
                    and any(PER_PROCESS_NAMES.intersection(c.co_names)
                            for c in nested_code(func.__code__)):
                return True
    return False
