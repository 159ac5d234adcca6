"""A dataset built again in each spawn/forkserver worker from the arguments
its constructor was called with (DL201's rebuild rung).

Some datasets hold what neither pickles nor copies: a pyarrow ``ParquetFile``,
a safetensors ``safe_open`` handle, a pandas ``read_csv(chunksize=...)``
reader. A forked worker inherits them; a spawned one (macOS, Windows,
Linux's forkserver) cannot receive them. Their constructor made them from a
path, so a worker can make them again: ``DS(*args, **kwargs)``, in the
worker, gives the dataset a forked worker would hold, exactly where building
it is deterministic and nothing was changed on it afterwards.

- Recording (``patches/datasets.py``): while the shim is active, each
  ``Dataset`` subclass's construction records its arguments when they are
  plain values (paths, numbers, strings, and small containers of them):
  nothing large is kept alive, and an argument that is an object (a tensor,
  another dataset) means no recipe.
- Checking, in the training process, before any worker is asked for: the
  dataset is built a second time from the recorded arguments, with the random
  generators (Python's, numpy's, torch's) reseeded for the check and put back
  after it, what it prints discarded, and any file write refused (an audit hook: an
  ``open`` for writing, a remove, a rename). Accepted only when the second
  build's state equals the original's now (``digest``: every attribute's
  value, file objects by name, mode, position and the file's size and
  modification time, opaque handles by type): a dataset changed after its
  construction (an attribute set, a reader advanced, a random split drawn)
  differs and is refused.
- In each worker the dataset is built again, quietly, and its state compared
  with the one the parent checked: a file that changed in between fails the
  worker loudly rather than give other data.

The ladder prefers fork where it is safe (it runs no constructor twice);
this rung is for platforms without fork, before emulated workers.
"""

import contextlib
import copy
import hashlib
import io
import mmap
import os
import pickle
import sys
import threading
import types
import weakref

from ..inspection import holdings, objwalk

PROTOCOL = pickle.DEFAULT_PROTOCOL
MAX_RECORDED_VALUES = 64   # a recipe of more plain values is not kept
MAX_DIGEST_NODES = 100_000
MAX_DIGEST_DEPTH = 32
CHECK_SEED = 0x5EED_0DD5   # the check's generators differ from the program's


class RebuildFailed(RuntimeError):
    """In a worker: the dataset built again is not the one the parent checked."""


# -- recording constructor arguments ----------------------------------------------

_recipes = {}  # id(dataset) -> (weak reference, class, args, kwargs)


def record(obj, cls, args, kwargs):
    """Keep ``cls(*args, **kwargs)`` as the recipe of ``obj``, where the
    arguments are plain values; fails silently (a recipe is an option)."""
    budget = [MAX_RECORDED_VALUES]
    if not (all(_plain(a, budget) for a in args)
            and all(_plain(v, budget) for v in kwargs.values())):
        return
    key = id(obj)
    try:
        ref = weakref.ref(obj, lambda _ref, key=key: _recipes.pop(key, None))
    except TypeError:  # __slots__ without __weakref__: no recipe
        return
    _recipes[key] = (ref, cls, copy.deepcopy(args), copy.deepcopy(kwargs))


_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _plain(value, budget):
    budget[0] -= 1
    if budget[0] < 0:
        return False
    if type(value) in _PLAIN or objwalk.is_a(value, os.PathLike) and \
            type(value).__module__.startswith("pathlib"):
        return True
    if type(value) in (list, tuple, set, frozenset):
        return all(_plain(item, budget) for item in value)
    if type(value) is dict:
        return all(_plain(k, budget) and _plain(v, budget) for k, v in value.items())
    return False


def recipe_of(obj):
    """``(class, args, kwargs)`` recorded for ``obj``, or None."""
    found = _recipes.get(id(obj))
    if found is None or found[0]() is not obj or type(obj) is not found[1]:
        return None
    return found[1:]


# -- the state compared -------------------------------------------------------------

class Unverifiable(Exception):
    """The state is too large or deep to compare."""


def digest(obj):
    """A fingerprint of what ``obj`` holds: equal for two builds that hold the
    same values, files at the same positions and handles of the same kinds."""
    return _Digest().of(obj)


class _Digest:
    def __init__(self):
        self.h = hashlib.blake2b(digest_size=20)
        self.memo, self.kept, self.nodes = {}, [], 0

    def of(self, obj):
        self.feed(obj, 0)
        return self.h.hexdigest()

    def put(self, text):
        self.h.update(text.encode("utf-8", "backslashreplace") + b"\0")

    def feed(self, obj, depth):
        self.nodes += 1
        if self.nodes > MAX_DIGEST_NODES or depth > MAX_DIGEST_DEPTH:
            raise Unverifiable("more than %d objects or %d levels"
                               % (MAX_DIGEST_NODES, MAX_DIGEST_DEPTH))
        cls = type(obj)
        self.put("%s.%s" % (_module(cls), cls.__qualname__))
        if cls in _PLAIN:
            self.put(repr(obj))
            return
        if id(obj) in self.memo:  # shared or cyclic: where it was seen first
            self.put("@%d" % self.memo[id(obj)])
            return
        self.memo[id(obj)] = len(self.memo)
        self.kept.append(obj)  # alive until the end: ids stay unique
        if self.payload(obj) or self.leaf(obj):
            return
        if cls in (list, tuple) or objwalk.is_a(obj, (list, tuple)):
            self.put(str(len(obj)))
            for item in (list.__iter__ if objwalk.is_a(obj, list) else tuple.__iter__)(obj):
                self.feed(item, depth + 1)
        elif objwalk.is_a(obj, dict):
            self.put(str(len(obj)))
            for key, value in list(dict.items(obj)):
                self.feed(key, depth + 1)
                self.feed(value, depth + 1)
        elif objwalk.is_a(obj, (set, frozenset)):  # in no order: hashes vary by process
            self.put(" ".join(sorted(digest(item) for item in obj)))
        if type(obj) in (list, tuple, dict, set, frozenset) or self.by_pickle(obj):
            return
        self.attributes(obj, depth)

    def payload(self, obj):
        """Tensors and arrays, by their bytes."""
        torch = sys.modules.get("torch")
        if torch is not None and objwalk.is_a(obj, torch.Tensor):
            t = obj.detach()
            self.put("%s %s %s %s" % (t.dtype, tuple(t.shape), t.device.type, t.layout))
            if t.layout == torch.strided and t.device.type != "meta":
                data = t.cpu().contiguous().reshape(-1)
                self.h.update(data.view(torch.uint8).numpy().tobytes() if data.numel()
                              else b"")
            return True
        numpy = sys.modules.get("numpy")
        if numpy is not None and objwalk.is_a(obj, numpy.ndarray):
            self.put("%s %s" % (obj.dtype, obj.shape))
            if obj.dtype.hasobject:
                for item in obj.ravel().tolist():
                    self.feed(item, 1)
            else:
                self.h.update(numpy.ascontiguousarray(obj).tobytes())
            return True
        return False

    def leaf(self, obj):
        """Files by what and where; code and modules by name; a lock by whether
        it is held (a fresh one is not)."""
        if holdings.is_file_object(obj) or type(obj) is mmap.mmap:
            self.put(_file_state(obj))
            return True
        if holdings.threading_kind(obj) not in (None, "thread"):
            self.put("held" if holdings.held(obj) else "free")
            return True
        if objwalk.is_a(obj, types.GeneratorType):  # how far it ran: a new one has not
            frame = obj.gi_frame
            self.put("%s %s" % (obj.gi_code.co_qualname if hasattr(obj.gi_code, "co_qualname")
                                else obj.gi_code.co_name,
                                frame.f_lasti if frame is not None else "done"))
            return True
        if objwalk.is_a(obj, (types.FunctionType, types.MethodType, type, types.ModuleType,
                              types.BuiltinFunctionType)):
            code = getattr(obj, "__code__", None)
            self.put("%s %s %s" % (_module(obj),
                                   getattr(obj, "__qualname__", getattr(obj, "__name__", "")),
                                   code.co_code.hex() if code is not None else ""))
            return True
        return False

    def by_pickle(self, obj):
        """An object with pickling of its own (a DataFrame, an image) by its
        pickle; None where that fails (an open handle: by what it holds)."""
        cls = type(obj)
        if not any(name in vars(klass) for klass in cls.__mro__[:-1]
                   for name in ("__reduce__", "__reduce_ex__", "__getstate__")):
            return False
        try:
            sink = io.BytesIO()
            _CanonicalPickler(sink, PROTOCOL).dump(obj)
        except Exception:
            return False
        self.h.update(sink.getvalue())
        return True

    def attributes(self, obj, depth):
        """What the one walker calls an object's children (``objwalk.edges``)."""
        for edge in objwalk.edges(obj):
            self.put(edge.label())
            self.feed(edge.child, depth + 1)


class _CanonicalPickler(pickle.Pickler):
    """Sets in a fixed order: their own order follows string hashes, which
    differ between the training process and a worker."""

    def reducer_override(self, obj):
        if type(obj) in (set, frozenset):
            return type(obj), (sorted(obj, key=lambda item: (type(item).__name__, repr(item))),)
        return NotImplemented


def _module(obj):
    """The module that defines ``obj``; a spawned worker's main module is
    ``__mp_main__``, the training process's ``__main__``: the same one."""
    name = getattr(obj, "__module__", None) or ""
    return "__main__" if name == "__mp_main__" else name


def _file_state(f):
    """Name, mode, position, size and modification time of an open file."""
    parts = []
    for read in (lambda: getattr(f, "name", None), lambda: getattr(f, "mode", None),
                 lambda: f.closed, lambda: f.tell()):
        try:
            parts.append(repr(read()))
        except Exception:
            parts.append("?")
    try:
        st = os.fstat(f.fileno())
        parts.append("%d %d" % (st.st_size, st.st_mtime_ns))
    except Exception:
        pass
    return " ".join(parts)


# -- building again, guarded ----------------------------------------------------------

_guard = threading.local()
_hooked = []


def _watch_writes():
    """One audit hook for the process (hooks cannot be removed): it acts only
    in a thread that is building a dataset again for the check."""
    if not _hooked:
        sys.addaudithook(_refuse_writes)
        _hooked.append(True)


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_CHANGES = frozenset({"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.truncate",
                      "os.link", "os.symlink", "os.chmod", "os.chown", "os.utime",
                      "shutil.rmtree", "shutil.move", "shutil.copyfile", "sqlite3.connect"})


class WritesFiles(Exception):
    pass


def _refuse_writes(event, args):
    if not getattr(_guard, "on", False):
        return
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        writes = (isinstance(flags, int) and flags & _WRITE_FLAGS) or \
            (isinstance(mode, str) and any(c in mode for c in "wax+"))
        if not writes:
            return
        what = "opens %s for writing" % (path,)
    elif event in _CHANGES:
        what = "%s(%s)" % (event, args[0] if args else "")
    else:
        return
    if _guard.wrote is None:
        _guard.wrote = what
    raise WritesFiles(what)


@contextlib.contextmanager
def _generators_put_back(seed=None):
    """Python's, numpy's and torch's CPU generators as they were, after the
    block; reseeded to ``seed`` inside it, where given."""
    import random

    numpy = sys.modules.get("numpy")
    torch = sys.modules.get("torch")
    saved = (random.getstate(), numpy.random.get_state() if numpy is not None else None,
             torch.random.get_rng_state() if torch is not None else None)
    try:
        if seed is not None:
            random.seed(seed)
            if numpy is not None:
                numpy.random.seed(seed % (1 << 32))
            if torch is not None:
                torch.random.default_generator.manual_seed(seed)  # not CUDA's: lazy there
        yield
    finally:
        random.setstate(saved[0])
        if numpy is not None:
            numpy.random.set_state(saved[1])
        if torch is not None:
            torch.random.set_rng_state(saved[2])


class _Muted:
    """``sys.stdout``/``sys.stderr`` while a dataset is built again: what the
    building thread writes goes nowhere; other threads write as ever."""

    def __init__(self, stream, thread):
        self._stream, self._thread = stream, thread

    def write(self, text):
        if threading.get_ident() == self._thread:
            return len(text)
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def _quiet(logs=False):
    """What the constructor prints is not printed again; ``logs``: nor what it
    logs (in a worker, where nothing else runs yet: ``logging.disable`` is
    process-wide, so the training process's own check leaves logging alone)."""
    import logging

    out, err, me = sys.stdout, sys.stderr, threading.get_ident()
    sys.stdout = _Muted(out, me) if out is not None else None
    sys.stderr = _Muted(err, me) if err is not None else None
    previous = logging.root.manager.disable
    if logs:
        logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
        if logs:
            logging.disable(previous)


def build_again(cls, args, kwargs, seed=None, refuse_writes=False):
    """``cls(*args, **kwargs)``, quietly, with the program's generators put
    back; ``refuse_writes`` (the check in the training process): file writes
    refused (``WritesFiles``), and its logging left alone."""
    if refuse_writes:
        _watch_writes()
        _guard.on, _guard.wrote = True, None
    try:
        with _generators_put_back(seed), _quiet(logs=not refuse_writes):
            obj = cls(*args, **kwargs)
    except WritesFiles:
        raise
    except Exception:
        if refuse_writes and _guard.wrote is not None:
            raise WritesFiles(_guard.wrote) from None
        raise
    finally:
        if refuse_writes:
            wrote, _guard.on, _guard.wrote = _guard.wrote, False, None
    if refuse_writes and wrote is not None:  # caught by the constructor itself
        raise WritesFiles(wrote)
    return obj


# -- the check, the reducer, the worker's side -----------------------------------------

class Recipe:
    __slots__ = ("cls", "args", "kwargs", "digest")

    def __init__(self, cls, args, kwargs, state):
        self.cls, self.args, self.kwargs, self.digest = cls, args, kwargs, state


_approved = {}  # id(dataset) -> (weak reference, Recipe)


def approve(obj):
    """``(Recipe, None)`` where ``obj`` can be built again exactly in a worker
    (checked by building it again here), else ``(None, why not)``. Runs the
    user's constructor once more: called only where no other exact rung is."""
    found = _approved.get(id(obj))
    if found is not None and found[0]() is obj:
        return found[1], None
    recipe = recipe_of(obj)
    if recipe is None:
        return None, ("its constructor's arguments were not recorded (made before "
                      "autosafe_torch was active, or from objects, not plain values)")
    cls, args, kwargs = recipe
    try:
        pickle.dumps((cls, args, kwargs), PROTOCOL)
        before = digest(obj)
    except Unverifiable as exc:
        return None, "its state is too large to compare (%s)" % exc
    except Exception as exc:
        return None, "its class or arguments do not pickle (%s)" % type(exc).__name__
    try:
        twin = build_again(cls, args, kwargs, seed=CHECK_SEED, refuse_writes=True)
    except WritesFiles as exc:
        return None, "its constructor writes files (%s)" % exc
    except Exception as exc:
        return None, "building it again raised %s" % type(exc).__name__
    try:
        same = digest(twin) == before
    except Exception:
        same = False
    finally:
        _close_files(twin)
    if not same:
        return None, ("built again from its arguments it holds other values (changed after "
                      "construction, or random)")
    made = Recipe(cls, args, kwargs, before)
    _approved[id(obj)] = (weakref.ref(obj, lambda _r, key=id(obj): _approved.pop(key, None)),
                          made)
    return made, None


def _close_files(obj):
    """The twin's own files are closed now, not whenever it is collected."""
    for _here, held, _edge in objwalk.walk(obj, "twin", stop=holdings.stop_at):
        if holdings.is_file_object(held):
            try:
                held.close()
            except Exception:
                pass


def reduce_rebuilt(obj):
    """ForkingPickler's reducer for a class with an approved instance: that
    instance goes as its recipe; others pickle as they always did."""
    found = _approved.get(id(obj))
    if found is None or found[0]() is not obj:
        return obj.__reduce_ex__(PROTOCOL)
    from ..inspection.probe import is_probing

    recipe = found[1]
    # At a worker's start: unchanged since the check? (Planning's probe pickles it
    # right after the check: hashing every byte it holds again would prove nothing.)
    if not is_probing() and digest(obj) != recipe.digest:
        raise TypeError("%s changed since it was checked: it cannot be built again in a "
                        "worker" % type(obj).__name__)
    return rebuilt_in_worker, (recipe.cls, recipe.args, recipe.kwargs, recipe.digest)


def reducers(classes):
    return {cls: reduce_rebuilt for cls in classes}


def rebuilt_in_worker(cls, args, kwargs, expected):
    """In a worker: the dataset built again, or ``RebuildFailed``."""
    obj = build_again(cls, args, kwargs)
    if digest(obj) != expected:
        raise RebuildFailed(
            "%s built again in this worker holds other values than in the training process "
            "(a file it reads changed?): this worker cannot give the same batches (DL201)"
            % cls.__qualname__)
    return obj


def approved_owner(owners, value):
    """``(path, dataset, None)`` for the innermost dataset holding ``value``
    (``owners``: ``objwalk.Owners`` of the loader's parts) that can be built
    again, else ``(None, None, why)``: why the innermost one cannot."""
    refusal = None
    for here, owner in owners.chain(value):
        if not _is_dataset(owner):
            continue
        recipe, why = approve(owner)
        if recipe is not None:
            return here, owner, None
        if refusal is None:
            refusal = "%s (%s) cannot be built again in a worker: %s" % (
                here, type(owner).__name__, why)
    return None, None, refusal


def _is_dataset(obj):
    torch = sys.modules.get("torch")
    try:
        return torch is not None and objwalk.is_a(obj, torch.utils.data.Dataset)
    except Exception:
        return False
