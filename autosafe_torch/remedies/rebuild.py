"""A dataset built again in each spawn/forkserver worker by the call that built
it (DL201's rebuild rung), checked there against the training process's.

Some datasets hold what neither pickles nor copies (a pyarrow ``ParquetFile``,
an Arrow IPC reader over a memory map, a safetensors ``safe_open`` handle, a
pandas ``read_csv(chunksize=...)`` reader): a forked worker inherits them, a
spawned one (macOS, Windows, Linux's forkserver) cannot receive them. Their
constructor made them from paths, so ``DS(*args, **kwargs)`` in a worker
gives what a forked worker would hold, where nothing the constructor reads
differs between the processes: seen, not assumed, as every worker checks
what it built before it serves a batch. The ladder prefers fork where it is
safe (no constructor runs twice): this rung is for platforms without fork,
before emulated workers.

NOTE [the rebuild's three places]

1. The training process, at the program's own construction (``Construction``,
   bounded by ``patches/datasets.py``), records for that call only: the class
   and arguments (references, never copies; one the program let go is not
   kept alive, and the rung is then refused), the random generators as they
   stood before the call where it drew from them, the files it opened and
   still holds (``inspection/opened.py``: path, device, inode, size, mtime, in
   order) and its attributes at return. No user code runs that the program
   did not call.
2. The training process, at a worker's start (``reduce_rebuilt``): the
   dataset goes as its call and what the worker must find (``Expected``).
3. The worker (``rebuilt_in_worker``): the call, muted (prints, native writes
   to stdout/stderr, warnings, logging), every file write refused (an audit
   hook, in workers only), from the generators the construction drew from.
   Then the same files opened, in the same order and state; no file mapped
   that the training process does not map; every attribute's fingerprint
   (``inspection/digest.py``) the same. Any difference fails the worker's
   start loudly (``RemedyFailed``, naming the attribute or file) before its
   first batch, and the recovery takes the next rung (emulated workers, or
   ``NoExactRung``).

Assumed (docs/rules.md, DL201): what the constructor reads otherwise than
through a file it keeps open or maps (a closed file, a network service, the
clock, the environment) shows in the values it leaves on the dataset, which
the fingerprints compare; a native library's own writes are not refused (the
audit hook sees Python's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import sys
import threading
import types
import warnings
import weakref
from typing import Any, NamedTuple
from multiprocessing import context

from ..inspection import digest, opened, reads
from ..inspection.failures import RemedyFailed
from ..inspection.holdings import loaded
from ..inspection.objwalk import is_a
from . import generators, process_state
from .pickling import install as install_reducers

PROTOCOL = 4


# -- 1. recording the program's construction --------------------------------------

class Construction:
    """How a dataset was made (the NOTE above). ``call()``: ``(class, args,
    kwargs)``, or None where an argument the program let go is gone;
    ``opened``: None where the ``__init__``'s end was not seen; ``changed``:
    the labels of the globals its code reads that the call changed (a
    counter), which a worker's build has as the import made them (DL220)."""

    __slots__ = ("cls", "args", "kwargs", "rng", "opened", "attrs", "changed")

    def __init__(self, cls, args, kwargs):
        self.cls, self.args, self.kwargs = cls, args, kwargs
        self.rng = self.opened = self.attrs = None
        self.changed: frozenset[str] = frozenset()

    def call(self):
        try:
            return self.cls, tuple(map(_kept, self.args)), {
                k: _kept(v) for k, v in self.kwargs.items()}
        except LookupError:
            return None

    def gone(self):
        """Words for the first argument the program let go, or None."""
        for where, value in list(enumerate(self.args)) + list(self.kwargs.items()):
            if type(value) is _Weak and value.ref() is None:
                return "its argument %s (%s) was freed by the program after construction" % (
                    where, value.kind)
        return None


class _Weak(NamedTuple):  # an argument held weakly: the program's to keep or let go
    ref: Any
    kind: str


def _kept(value):
    if type(value) is _Weak:
        value = value.ref()
        if value is None:
            raise LookupError
    return value


# kept strongly: they cost nothing (the program's small values, its code) or refuse weakrefs
_STRONG = (type(None), bool, int, float, complex, str, bytes, tuple, list, dict, set,
           frozenset, type)


def _held(value, attrs):
    """``value`` as the record keeps it: weakly, unless the dataset holds it or
    it cannot be referred to weakly."""
    if isinstance(value, _STRONG) or callable(value) or any(v is value for v in attrs):
        return value
    try:
        return _Weak(weakref.ref(value), "a %s" % type(value).__name__)
    except TypeError:
        return value


# id(dataset) -> (weak reference, Construction)
_constructions: dict[int, tuple[Any, Construction]] = {}
_local = threading.local()  # .again: this thread builds a dataset for a worker


def recording():
    """Whether constructions are recorded now (not while a worker builds one)."""
    return not getattr(_local, "again", False)


def begin(obj, cls, args, kwargs):
    """``Dataset.__new__`` made ``obj``: its call, until its ``__init__`` ends."""
    key = id(obj)
    try:
        ref = weakref.ref(obj, lambda _ref: _constructions.pop(key, None))
    except TypeError:  # __slots__ without __weakref__: no record
        return None
    made = Construction(cls, args, kwargs)
    _constructions[key] = (ref, made)
    return made


def measured(made, obj, init, args, kwargs):
    """The program's own ``init(obj, *args, **kwargs)``, recorded in ``made``."""
    before_rng = generators.capture()
    with opened.TURNS.recording():  # no thread of ours closes a descriptor meanwhile
        before_fds = opened.snapshot()
        read = _globals_read(type(obj))
        before = [process_state.mark(r) for r in read]
        result = init(obj, *args, **kwargs)
        try:
            made.changed = frozenset(r.label for r, mark in zip(read, before)
                                     if process_state.mark(r) != mark)
            # Files only: another thread may open a pipe or a socket meanwhile (the
            # program's own); a worker's build, alone in its process, refuses those.
            made.opened = [o for o in opened.opened_since(before_fds) if o.kind == opened.FILE]
            if not generators.same(before_rng, generators.capture()):
                made.rng = before_rng
            attrs = digest.attributes(obj)
            made.attrs = {name: _state(value) for name, value in attrs}
            values = [value for _name, value in attrs]
            made.args = tuple(_held(a, values) for a in made.args)
            made.kwargs = {k: _held(v, values) for k, v in made.kwargs.items()}
        except Exception:  # a record is an option: never the program's problem
            made.opened = None
    return result


_read_by: weakref.WeakKeyDictionary[type, tuple[Any, ...]] = weakref.WeakKeyDictionary()


def _globals_read(cls):
    found = _read_by.get(cls)
    if found is None:
        try:
            found = reads.reads_of((), rebuilt=[cls])
        except Exception:
            found = ()
        _read_by[cls] = found
    return found


def construction_of(obj):
    found = _constructions.get(id(obj))
    if found is None or found[0]() is not obj or type(obj) is not found[1].cls:
        return None
    return found[1]


# -- deciding, in the training process: nothing is built here ----------------------

def refusal(obj):
    """Why ``obj`` cannot be built again in a worker, or None (each worker checks)."""
    made = construction_of(obj)
    if made is None:
        return ("its construction was not recorded (made before autosafe_torch was "
                "active, or by a class whose __init__ is not Python code)")
    if made.opened is None:
        return "its constructor's end was not seen (its __init__ is not Python code)"
    if (gone := made.gone()) is not None:
        return gone
    now = {}
    for name, value in digest.attributes(obj):
        if isinstance(value, threading.Thread):  # each build starts its own: never the same
            return "its attribute %s is a thread, which a build in a worker starts anew" % name
        now[name] = _state(value)
    for name, state in now.items():
        if name not in made.attrs:
            return "its attribute %s was set after construction" % name
        if state[0] != made.attrs[name][0]:
            return ("its attribute %s was set again after construction (a worker's build "
                    "would not hold it)" % name)
        if state != made.attrs[name]:
            return "its attribute %s (a %s) was %s after construction" % (
                name, state[1], "advanced" if state[1] == "generator" else "read")
    for name in made.attrs:
        if name not in now:
            return "its attribute %s was deleted after construction" % name
    return None


def _state(value):
    """What says an attribute changed since: the object it holds and, where it
    says so cheaply, how far a generator ran or where a C file object stands."""
    cls = type(value)
    if cls is types.GeneratorType:
        frame = value.gi_frame
        return id(value), "generator", frame.f_lasti if frame is not None else None
    if cls.__module__ in ("io", "_io"):
        with contextlib.suppress(Exception):
            return id(value), "file", value.tell()
        return id(value), "file", None
    return id(value), None, None


def rebuildable_owner(owners, value):
    """``(path, dataset, None)`` for the innermost dataset holding ``value``
    (``owners``: ``objwalk.Owners``) that may be built again, else ``(None,
    None, why the innermost may not)``."""
    why_not = None
    for here, owner in owners.chain(value):
        if not is_a(owner, loaded("torch.utils.data", "Dataset")):
            continue
        why = refusal(owner)
        if why is None:
            return here, owner, None
        if why_not is None:
            why_not = "%s (%s) cannot be built again in a worker: %s" % (
                here, type(owner).__name__, why)
    return None, None, why_not


# -- 2. at a worker's start, in the training process --------------------------------

@dataclasses.dataclass
class Expected:
    """What a worker's build must find (see the NOTE above)."""

    rng: Any  # the generators the construction drew from, as they stood before
    opened: list[Any]  # identities and names of the files it opened, in order
    maps: dict[Any, str]  # the files the training process maps now
    digests: dict[str, Any]  # attribute -> fingerprint, as the dataset holds it now
    name: str  # the dataset's class, for the words


def reduce_rebuilt(obj, candidates=frozenset()):
    """WorkerPickler's reducer for a class with an instance to build again: that
    instance goes as its call and what its worker must find (to a worker forked
    from a build server that built it, as a reference); others pickle as ever.
    ``candidates``: ids the plan's probe tries."""
    from ..inspection.probe import is_probing  # noqa: PLC0415 - 0.6 ms in each worker that unpickles a rebuilt dataset (-X importtime after torch: inspection.probe, inventory)

    made = construction_of(obj)
    probing = is_probing()
    chosen = id(obj) in _planned or probing and id(obj) in candidates
    call = made.call() if made is not None and chosen else None
    if call is None:
        return obj.__reduce_ex__(PROTOCOL)  # raises, as ever
    if probing:  # the plan's probe: do the call's arguments pickle?
        return rebuilt_in_worker, call + (None,)
    popen: Any = context.get_spawning_popen()  # with built_here: warmstart's WarmPopen
    key = (getattr(popen, "built_here", None) or {}).get(id(obj))
    if key is not None:
        return popen.from_server, (key, _expected(obj, made))
    return recipe(obj, call)


def recipe(obj, call=None):
    """What a worker or a build server builds ``obj`` from (else it raises)."""
    made = construction_of(obj)
    call = call or (made.call() if made is not None else None)
    if call is None:
        raise LookupError("no call recorded for this dataset")
    return rebuilt_in_worker, call + (_expected(obj, made),)


def _expected(obj, made):
    return Expected(generators.portable(made.rng), [(o.identity, o.path) for o in made.opened],
                    opened.mapped_files(), digest.attribute_digests(obj),
                    made.cls.__qualname__)


_planned: set[int] = set()  # ids of the datasets a finding chose to build again


def install(datasets):
    """Build ``datasets`` again in workers: a finding's remedy, in fix mode."""
    for obj in datasets:
        key = id(obj)
        if key not in _planned:
            weakref.finalize(obj, _planned.discard, key)
            _planned.add(key)
    install_reducers({type(obj): reduce_rebuilt for obj in datasets})


def planned_reducers(datasets):
    """The reducers the plan's probe tries for ``datasets`` (nothing installed)."""
    reducer = functools.partial(reduce_rebuilt, candidates=frozenset(map(id, datasets)))
    return {type(obj): reducer for obj in datasets}


# -- 3. in the worker ------------------------------------------------------------------

def rebuilt_in_worker(cls, args, kwargs, expected):
    """In a worker: the dataset built again and checked, else ``Unbuilt``."""
    _local.again = True  # not the program's construction: not recorded
    try:
        with _muted(), _refused_writes() as wrote, \
                _drawing_from(generators.from_portable(expected.rng)):
            fds, maps = opened.snapshot(), opened.mapped_files()
            obj = cls(*args, **kwargs)
            added, mapped = opened.opened_since(fds), opened.mapped_files()
    except Exception as exc:
        if not wrote:
            return Unbuilt("the dataset (%s) could not be built again in the worker: %s: %s"
                           % (expected.name, type(exc).__name__, _short(exc)))
        written = exc if isinstance(exc, _WritesFiles) else wrote[0]
    else:
        written = wrote[0] if wrote else None  # it caught the error
    finally:
        _local.again = False
    why = ("its constructor writes files (%s)" % written if written is not None
           else _other_files(added, expected) or next((
               "it maps %s, which the training process does not" % _base(path)
               for key, path in mapped.items() if key not in maps and key not in expected.maps),
               None) or _other_values(obj, expected))
    if why is None:
        _held_files[id(obj)] = [o.fd for o in added]
        return obj
    return Unbuilt("the dataset (%s) built again in the worker differs: %s"
                   % (expected.name, why))


# id(a dataset built here) -> the descriptors its build opened, in order
_held_files: dict[int, list[int]] = {}


def still_the_same(obj, expected):
    """In a worker forked from a build server: ``obj`` (built and checked there) if
    its files and values are still ``expected``'s, else ``Unbuilt``."""
    if isinstance(obj, Unbuilt):
        return obj
    why = None
    for fd, (identity, path) in zip(_held_files.get(id(obj), ()), expected.opened):
        try:
            st = os.fstat(fd)
        except OSError:
            why = "%s is no longer open" % _base(path)
            break
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != tuple(identity):
            why = "%s changed since the training process opened it" % _base(path)
            break
    why = why or _other_values(obj, expected)
    if why is None:
        return obj
    return Unbuilt("the dataset (%s) built in the server differs now: %s" % (expected.name, why))


class Unbuilt:
    """A dataset built again that differs: the worker's start fails at its first
    use (``worker_init_fn`` or first fetch), as torch reports a worker's error,
    and the recovery takes the next rung."""

    def __init__(self, message):
        object.__setattr__(self, "_message", message)

    def _fail(self, *args, **kwargs):
        raise RemedyFailed(object.__getattribute__(self, "_message"))

    __getattr__ = __getitem__ = __iter__ = __len__ = __call__ = _fail


def _other_files(added, expected):
    others = [o.what for o in added if o.kind != opened.FILE]
    if others:
        return "its constructor opened %s, and a handle over what is no file is not made " \
            "again" % others[0]
    here = [(o.identity, o.path) for o in added]
    there = [tuple(item) for item in expected.opened]
    if [i for i, _p in here] == [i for i, _p in there]:
        return None
    for (mine, my_path), (theirs, their_path) in zip(here, there):
        if mine[:2] != theirs[:2]:
            if {i[:2] for i, _p in here} == {i[:2] for i, _p in there}:
                return "it opened its files in another order (%s first, the training process %s)" \
                    % (_base(my_path), _base(their_path))
            return "it opened %s, the training process %s" % (
                _base(my_path), _base(their_path))
        if mine != theirs:
            return "%s changed since the training process opened it" % _base(my_path)
    if len(here) > len(there):
        return "it opened %s, which the training process did not" % _base(here[len(there)][1])
    return "it did not open %s, which the training process did" % _base(there[len(here)][1])


def _other_values(obj, expected):
    mine = digest.attribute_digests(obj)
    for name, value in expected.digests.items():
        if name not in mine:
            return "it has no attribute %s" % name
        if mine[name] != value:
            return ("its attribute %s holds other values (changed after construction, or "
                    "random)" % name)
    for name in mine:
        if name not in expected.digests:
            return "it has an attribute %s that the training process's has not" % name
    return None


def _base(path):
    return os.path.basename(path) if path else "a file"


def _short(exc):
    try:
        return (str(exc).splitlines() or [""])[0][:120]
    except Exception:  # a __str__ that raises
        return ""


@contextlib.contextmanager
def _drawing_from(states):
    if states is None:
        yield
        return
    own = generators.capture()
    generators.restore(states)
    try:
        yield
    finally:
        generators.restore(own)


@contextlib.contextmanager
def _muted():
    """What the build prints, warns and logs goes nowhere (no other code runs in a
    worker that is starting)."""
    saved_fds = []
    with contextlib.suppress(Exception):
        sys.stdout.flush() if sys.stdout else None
        sys.stderr.flush() if sys.stderr else None
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                saved_fds.append((fd, os.dup(fd)))
                os.dup2(null, fd)
    finally:
        os.close(null)
    quiet = types.SimpleNamespace(write=len, flush=lambda: None, isatty=lambda: False)
    disabled = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(disabled)
        for fd, saved in saved_fds:
            os.dup2(saved, fd)
            os.close(saved)


# -- file writes refused while a worker builds ---------------------------------------

class _WritesFiles(Exception):
    pass


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_CHANGES = frozenset({"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.truncate",
                      "os.link", "os.symlink", "os.chmod", "os.chown", "os.utime",
                      "shutil.rmtree", "shutil.move", "shutil.copyfile", "sqlite3.connect"})
_guard: dict[str, Any] = {"wrote": None, "hooked": False}


@contextlib.contextmanager
def _refused_writes():
    """File writes refused in this (worker) process; yields a list that gets the
    first refused write (a constructor may catch the error)."""
    if not _guard["hooked"]:
        sys.addaudithook(_refuse_writes)  # for good: this process is a worker of ours
        _guard["hooked"] = True
    wrote: list[str] = []
    _guard["wrote"] = wrote
    try:
        yield wrote
    finally:
        _guard["wrote"] = None


def _refuse_writes(event, args):
    wrote = _guard["wrote"]
    if wrote is None:
        return
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        writes = (isinstance(flags, int) and flags & _WRITE_FLAGS) or \
            (isinstance(mode, str) and any(c in mode for c in "wax+"))
        if not writes or path == os.devnull:
            return
        what = "opens %s for writing" % (_base(os.fsdecode(path)) if isinstance(
            path, (str, bytes)) else path,)
    elif event in _CHANGES:
        what = "%s(%s)" % (event, _base(str(args[0])) if args else "")
    else:
        return
    if not wrote:
        wrote.append(what)
    raise _WritesFiles(what)
