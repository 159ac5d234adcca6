"""One emulated worker's own copy of a loader's parts, as a forked worker has
it, or a clear refusal: never two workers sharing one stateful object. A
``copy.deepcopy`` of the dataset, collate_fn and worker_init_fn, with what
deepcopy cannot do done in its memo (``_KINDS``):

- a named file's memory map is mapped again at its access and position; an
  anonymous or privately written one is refused;
- a file open for reading (a PIL image of several frames too) is opened again
  at the parent's position and mode, a description of its own as DL207 gives
  a forked worker; a read-write one (``'r+b'``, a ``NamedTemporaryFile``, whose
  copy never deletes the file) through ``/proc/self/fd/N``;
- what forked workers share in effect (a written file, a socket, a logger, an
  lmdb handle, a large tensor) is shared;
- a function with a closure or defaults is rebuilt around copies of them (code
  and globals shared, as ``emulated_workers`` notes);
- locks are new ones in the same state (a held one is refused); a thread pool
  is a new, empty one of its size (DL208);
- an object whose own pickling (which deepcopy goes through) drops an open file
  (``dropped.unfaithful``) is refused, unless its class opens it again; what
  deepcopy refuses goes through a pickle round trip, as a spawned worker
  receives it; where that fails too (a ``csv.reader``, a C library's handle, a
  weak proxy, a started generator, a text file whose newline mode cannot be
  read back), ``NoExactRung`` names the object and the permanent fix.
"""

import contextlib
import copy
import io
import logging
import mmap
import os
import pickle
import re
import stat
import threading
import types
import weakref
from typing import Any

from ..inspection import dropped, holdings, objwalk
from ..errors import NoExactRung
from ..inspection.failures import describe_exception
from ..inspection.naming import what_is
from ..mp_private import new_semaphore
from ..report import shorten_line
from . import images, isolation
from .byvalue import _new_instance  # an empty instance, as pickle's default makes one
from .pickling import WorkerPickler
from .reopen import file_reducers, reopen

# Tensors and arrays this large are shared (a forked worker shares them
# copy-on-write); smaller ones, which a dataset may mutate (counters), are copied.
SHARE_AT_BYTES = 1 << 20

# The most objects a copy may find that deepcopy cannot copy (each costs a retry).
MAX_UNCOPYABLE = 64

def _payload_bytes(obj):
    """Bytes a deep copy of a tensor or array would duplicate, or None."""
    if objwalk.is_a(obj, holdings.loaded("torch", "Tensor")):
        try:
            return obj.untyped_storage().nbytes()
        except Exception:  # sparse, nested, meta: not copied by value either
            return SHARE_AT_BYTES
    if objwalk.is_a(obj, holdings.loaded("numpy", "ndarray")):
        return obj.nbytes
    return None


def _written_or_not_regular(f):  # a terminal too: forked workers share it in effect
    if objwalk.is_a(f, holdings.loaded("socket", "socket")):
        return True
    raw = holdings.raw_file(f)
    try:
        return raw is not None and not raw.closed and (
            not raw.readable() or not stat.S_ISREG(os.fstat(io.FileIO.fileno(raw)).st_mode))
    except (OSError, ValueError):
        return False


class CopyPlan:
    """Found once per iterator. ``shared``: ``(path, type name, why)`` for the log."""

    def __init__(self, objects, names=None):
        self.objects = objects
        self.shared = []
        self.watched = {}  # id -> (generator, path): shared while no worker advances it
        self._of: dict[str, dict[int, Any]] = {kind: {} for kind, _test, _why in _KINDS}
        self._by_id: dict[int, Any] = {}  # id -> every object the walk met
        self._paths: dict[int, str] = {}
        roots = list(zip(names, objects)) if names else [("worker", objects)]
        for name, root in roots:
            for path, obj in _walk(root, name):
                if id(obj) not in self._by_id:  # else met under another root
                    self._paths[id(obj)], self._by_id[id(obj)] = path, obj
                    self._classify(path, obj)
        # The first object whose own pickling drops an open file not opened again
        # here; files travel as the memo gives them (``file_reducers``).
        self._refused = next((NoExactRung("%s (%s) cannot be copied for each emulated worker: "
                                          "it %s" % (f.path, what_is(f.value), f.error), f.fix)
                              for f in dropped.unfaithful(dict(roots), file_reducers())
                              if not dropped.reopens(f.value)), None)

    def _classify(self, path, obj):
        for kind, test, why in _KINDS:
            if test(obj):
                self._of[kind][id(obj)] = obj
                if why is not None:
                    self.shared.append((path, type(obj).__name__, why))
                return

    def path_of(self, obj):
        return self._paths.get(id(obj)) or "an object of type %s" % type(obj).__name__

    def copy(self):
        if self._refused is not None:
            raise self._refused
        made = dict(self._of["shared"])  # shared, opened anew, made anew: kept over retries
        from .pools import _new_pool, _recipe  # noqa: PLC0415 - 0.4 ms at `import torch`, where the recovery loads this module (-X importtime: remedies.pools)

        try:
            for kind, make in (("file", self._own_file), ("lock", self._new_lock),
                               ("pool", lambda pool: _new_pool(*_recipe(pool)))):
                for key, obj in self._of[kind].items():
                    made[key] = make(obj)
            for _ in range(MAX_UNCOPYABLE):
                memo = dict(made)
                try:
                    return self._deepcopy(memo)
                except NoExactRung:
                    raise
                except Exception as exc:
                    culprit = _failed_object(exc.__traceback__)
                    if culprit is None or id(culprit) in made:
                        raise NoExactRung("%s cannot be copied for each emulated worker (%s)"
                                          % (self._named(culprit), _short(exc))) from exc
                    made[id(culprit)] = self._round_trip(culprit, exc)
            raise NoExactRung("too many objects that cannot be copied for emulated workers")
        except BaseException:
            for key in self._of["file"]:
                with contextlib.suppress(Exception):
                    made[key].close()  # KeyError where not opened yet: suppressed
            raise

    def _deepcopy(self, memo):
        # Instances built from their __dict__ are empty first: what reaches them (a
        # weak proxy's referent) finds their copy.
        direct = self._of["direct"]
        for key, obj in direct.items():
            memo[key] = _new_instance(type(obj))
        for kind, copier in (("twin", _twin),
                             ("buffered", _buffered_copy), ("function", _rebuilt)):
            for key, obj in self._of[kind].items():
                if key not in memo:
                    memo[key] = copier(obj, memo)
        for key, ref in self._of["weak"].items():
            if (referent := _referent(ref, self._by_id)) is not None:
                memo[key] = (weakref.proxy if objwalk.is_a(ref, _PROXIES) else weakref.ref)(
                    copy.deepcopy(referent, memo))
        for key, obj in direct.items():
            state = object.__getattribute__(obj, "__dict__")
            object.__getattribute__(memo[key], "__dict__").update(copy.deepcopy(state, memo))
        return copy.deepcopy(self.objects, memo)

    def _named(self, obj):
        return "an object" if obj is None else "%s (%s)" % (self.path_of(obj), what_is(obj))

    def _own_file(self, f):
        if type(f) is mmap.mmap:
            return self._own_map(f)
        image = dropped.is_image_file(f)
        errors = (OSError, ValueError, RuntimeError) if image else (OSError, ValueError)
        try:
            if image:
                return images.copy_of(f)
            with contextlib.suppress(OSError, ValueError):
                return reopen(f)
            if objwalk.is_a(f, io.TextIOWrapper):
                raise NoExactRung("%s: each emulated worker needs its own, and its newline "
                                  "mode cannot be read back (the file holds carriage returns)"
                                  % self._named(f))
            return _reopen_binary(f)
        except errors as exc:
            raise NoExactRung("%s cannot be opened again for each emulated worker (%s)"
                              % (self._named(f), _short(exc)),
                              dropped.IMAGE_FIX if image else None) from exc

    def _own_map(self, m):
        from ..inspection.mappings import map_reference  # noqa: PLC0415 - 0.2 ms at `import torch`, where the recovery loads this module (-X importtime: inspection.mappings)
        from . import memmaps  # noqa: PLC0415 - 1.4 ms at `import torch`, where the recovery loads this module (-X importtime: remedies.memmaps)

        ref, why = map_reference(m)
        if ref is None:
            raise NoExactRung("%s cannot be mapped again for each emulated worker (%s)"
                              % (self._named(m), why))
        try:
            return memmaps.map_again(*ref.args())
        except memmaps.MappedFileChanged as exc:
            raise NoExactRung("%s: %s" % (self._named(m), exc)) from exc

    def _new_lock(self, lock):
        kind = holdings.threading_kind(lock)
        make = {"lock": threading.Lock, "rlock": threading.RLock, "event": threading.Event,
                "condition": threading.Condition, "semaphore": lambda: new_semaphore(lock)}
        if kind not in make:
            raise NoExactRung("%s cannot be made anew for each emulated worker" % self._named(lock))
        if kind in ("lock", "rlock") and holdings.held(lock):
            raise NoExactRung("%s is held now: a worker's copy would wait for it forever"
                              % self._named(lock))
        new = make[kind]()
        if kind == "event" and lock.is_set():
            new.set()
        return new

    def _round_trip(self, obj, exc):
        """``obj`` as a spawned worker would receive it; a generator is shared,
        watched: refused as soon as a worker advances it."""
        if objwalk.is_a(obj, types.GeneratorType):
            if obj.gi_frame is not None:
                self.watched[id(obj)] = (obj, self.path_of(obj))
            self.shared.append((self.path_of(obj), "generator", "shared while no worker "
                                "advances it (one that does is refused)"))
            return obj
        if (again := _torch_generator_copy(obj)) is not None:
            return again
        try:
            return pickle.loads(WorkerPickler.dumps(obj))  # as a spawned worker receives it
        except Exception:
            raise NoExactRung("%s neither pickles for spawn workers nor copies for "
                              "emulated ones, and no two workers may share it"
                              % self._named(obj)) from None


def _torch_generator_copy(obj):
    """A ``torch.Generator``'s seed and state, as a forked worker holds it (torch 2.0
    does not pickle one), else None."""
    if type(obj) is not holdings.loaded("torch", "Generator"):
        return None
    new = type(obj)(device=obj.device)
    new.manual_seed(obj.initial_seed())
    new.set_state(obj.get_state())
    return new


def positions(watched):
    """Where each generator the copies share (``CopyPlan.watched``) stands: a
    worker's step that moves one is refused, as each forked worker would have
    advanced its own."""
    return [None if g.gi_frame is None else g.gi_frame.f_lasti for g, _path in watched]


def _walk(root, name):
    """The one walker's ``(path, obj)``, and what a function's closure and defaults hold."""
    stack = [(name, root)]
    seen = set()
    while stack:
        path, obj = stack.pop()
        for here, found, _edge in objwalk.walk(obj, path, stop=_stop):
            if id(found) in seen:
                continue
            seen.add(id(found))
            yield here, found
            if objwalk.is_a(found, types.FunctionType):
                for i, cell in enumerate(found.__closure__ or ()):
                    with contextlib.suppress(ValueError):  # an empty cell
                        stack.append(("%s.<closure %d>" % (here, i), cell.cell_contents))
                for label, value in ((".__defaults__", found.__defaults__),
                                     (".__kwdefaults__", found.__kwdefaults__)):
                    if value:
                        stack.append((here + label, value))


def _stop(obj):
    """Reported, never entered: payloads, kernel resources (a file on a descriptor,
    a native handle, a socket), locks, pools, loggers, PIL images (never their
    file). A file object written in Python (GzipFile) is entered: its files are inside."""
    if _payload_bytes(obj) is not None or holdings.stop_at_threading(obj) \
            or dropped.is_image_file(obj):
        return True
    if holdings.is_file_object(obj):
        return not (_file_in_python(obj) or _buffered_over_python(obj))
    return False


def _rebuilt(func, memo):
    cells = tuple(_cell_copy(c, memo) for c in func.__closure__) if func.__closure__ else None
    new = types.FunctionType(func.__code__, func.__globals__, func.__name__,
                             copy.deepcopy(func.__defaults__, memo), cells)
    new.__kwdefaults__ = copy.deepcopy(func.__kwdefaults__, memo)
    new.__qualname__, new.__module__ = func.__qualname__, func.__module__
    new.__dict__.update(copy.deepcopy(func.__dict__, memo))
    return new


def _buffered_over_python(f):
    """A buffered file over a raw written in Python (a GzipFile's decompressing
    reader): the buffer is a cache, rebuilt around a copy of the raw."""
    try:
        return type(f) in holdings.BUFFERED and not objwalk.is_a(f.raw, io.FileIO)
    except (ValueError, AttributeError):
        return False


def _decompressing(obj):  # gzip's, bz2's, lzma's reader: its stream can be read again
    return objwalk.is_a(obj, holdings.loaded("_compression", "DecompressReader"))


def _twin(obj, memo):
    """``obj``'s copy, in ``memo`` before its attributes: a decompressing reader
    rewound with a fresh decompressor (the buffered file above it seeks); a
    temporary file's closer that never deletes the file (a forked worker's never does)."""
    twin = memo[id(obj)] = _new_instance(type(obj))
    state = {k: v for k, v in vars(obj).items() if k != "_decompressor"}
    twin.__dict__.update(copy.deepcopy(state, memo))
    if _decompressing(obj):
        twin._rewind()
    else:
        twin.delete = False
        if "delete_on_close" in twin.__dict__:
            twin.delete_on_close = False
    return twin


def _buffered_copy(f, memo):
    raw = f.raw
    if _decompressing(raw):  # a decompressor copies (gzip's) or not (bz2's, lzma's)
        try:
            raw = copy.deepcopy(raw, dict(memo))
        except Exception:
            raw = _twin(raw, memo)
    else:
        raw = copy.deepcopy(raw, memo)
    twin = memo[id(f)] = type(f)(raw)
    if not f.closed and f.seekable():
        twin.seek(f.tell())
    return twin


def _file_in_python(obj):
    """A file object written in Python around other files (GzipFile, ZipExtFile, a
    user's IOBase): copied by its attributes; io's classes refuse deepcopy itself."""
    cls = type(obj)
    return objwalk.is_a(obj, io.IOBase) and cls.__module__ not in ("_io", "io") \
        and "__dict__" in dir(cls) and not objwalk.slot_names(cls)


_PROXIES = (weakref.ProxyType, weakref.CallableProxyType)
_WEAK = _PROXIES + (weakref.ReferenceType,)
_PROXIED = re.compile(r" to .+ at (0x[0-9a-fA-F]+)>$")

# ``(kind, test, why)``: an object's kind is the first whose test it passes; a
# "shared" one is given to the workers as it is, for the logged why.
_KINDS = (
    ("file", dropped.reopens, None),  # a PIL image, opened again at its frame
    ("shared", lambda obj: (_payload_bytes(obj) or 0) >= SHARE_AT_BYTES,
     "large tensor or array, read-only by contract"),
    ("shared", lambda obj: holdings.fork_unsafe(obj) in holdings.LMDB,
     "lmdb handle: one per process, and it holds no position"),
    ("shared", lambda obj: objwalk.is_a(obj, (logging.Logger, logging.Handler)), "logger"),
    ("shared", _written_or_not_regular,
     "not read from a file (written, a pipe, a socket): shared, as forked workers share it"),
    ("shared", lambda obj: holdings.threading_kind(obj) == "thread", "thread"),
    ("buffered", _buffered_over_python, None),
    ("twin", lambda obj: _decompressing(obj) or type(obj).__name__ == "_TemporaryFileCloser"
     and type(obj).__module__ == "tempfile", None),
    ("file", lambda obj: holdings.raw_file(obj) is not None or holdings.is_native_handle(obj)
     or holdings.sqlite_path(obj) is not None or type(obj) is mmap.mmap, None),
    ("function", lambda obj: objwalk.is_a(obj, types.FunctionType)
     and bool(obj.__closure__ or obj.__defaults__ or obj.__kwdefaults__), None),
    ("lock", lambda obj: holdings.threading_kind(obj) is not None, None),
    ("pool", lambda obj: holdings.thread_pool_in_use(obj) is not None, None),
    ("weak", lambda obj: objwalk.is_a(obj, _WEAK), None),
    ("direct", lambda obj: holdings.forwards_attributes(obj) or _file_in_python(obj), None),
)


def _referent(ref, objects):
    """What weak reference or proxy ``ref`` refers to, when one of ``objects`` (by
    id): a proxy says it only in its repr."""
    if objwalk.is_a(ref, weakref.ReferenceType):
        target = ref()
        return target if target is not None and id(target) in objects else None
    found = _PROXIED.search(repr(ref))  # CPython: the referent's type and address
    return objects.get(int(found.group(1), 16)) if found else None


def _cell_copy(cell, memo):
    try:
        return types.CellType(copy.deepcopy(cell.cell_contents, memo))
    except ValueError:  # empty
        return types.CellType()


def _reopen_binary(f):
    """Binary file ``f`` opened again through the kernel (read-write, or since deleted, too)."""
    raw = holdings.raw_file(f)
    if raw is None:  # a text file is refused before: its newline mode
        raise ValueError("not a binary file")
    import fcntl  # noqa: PLC0415 - POSIX only: absent on Windows

    fd = raw.fileno()
    st = os.fstat(fd)
    new = isolation.reopen_description(fd, st.st_dev, st.st_ino, fcntl.fcntl(fd, fcntl.F_GETFL))
    os.lseek(new, f.tell(), os.SEEK_SET)
    twin = io.FileIO(new, raw.mode, closefd=True)
    twin.name = raw.name
    return twin if f is raw else (
        type(f) if type(f) in holdings.BUFFERED else io.BufferedRandom)(twin)


def _short(exc):
    return shorten_line(describe_exception(exc, 1), 60)


def _failed_object(tb):
    """The innermost object ``copy.deepcopy`` was copying when it raised."""
    culprit = None
    while tb is not None:
        if tb.tb_frame.f_code is copy.deepcopy.__code__:
            culprit = tb.tb_frame.f_locals.get("x")
        tb = tb.tb_next
    return culprit
