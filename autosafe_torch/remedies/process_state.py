"""What ``main()`` set, every worker sees: the training process's state
carried to spawn and forkserver workers (DL220).

A worker that does not fork imports the program's modules again (the script
as ``__mp_main__``, its ``__main__`` block not run): what ``main()`` changed
at run time (a config dict filled from argparse, a class attribute, a
library function replaced, torch's default dtype) is back at its
import-time value there, and plain torch trains on other data without a
word. A forked worker has the program's values; so does a worker here.

NOTE [carrying the process state]

1. Which values: the globals and class attributes the workers' code reads
   (``inspection/reads.py``) and the settings a new interpreter resets
   (``SETTINGS``), kept on the loader by DL220 (``Carry``).
2. At each start of the workers (fork's semantics; persistent workers: at
   their first), each value and its fingerprint go ahead of the dataset, in
   the first thing torch sends, its dataset kind (``StateFirst``): an
   object a global and the dataset both hold is one object there, as under
   fork, and a ``__setstate__``, a rebuilt dataset (DL201), a logger
   (DL219), a map or a lock made again find the program's values. A large
   array goes once, through shared memory, not once per worker.
3. In the worker (``arrive``), before the dataset: where a fingerprint
   differs from its own value's, the training process's value is set. One
   that does not pickle is only compared: where it differs, the worker
   refuses before its first batch (``refuse_in_worker``) and the recovery
   takes the next rung. Never the import's value in silence.
4. Each worker says what it set in a file of the report directory, DL220's
   record is made from that (``Carry.outcome``: none where nothing
   differed, promise 1). A build server (``buildserver.py``) sets them
   before it builds, and its children say so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import itertools
import mmap
import os
import pickle
import sys
import types
from collections.abc import Sequence
from typing import Any, Callable

from ..inspection import digest
from ..inspection.failures import RemedyFailed, describe_exception
from ..inspection.holdings import is_file_object
from ..inspection.naming import number_of
from ..inspection.reads import Read
from ..report import Said, shorten_line, shown_site, without_addresses
from .pickling import WorkerPickler

# A refusal's words (the recovery reads them to give the fix) and the permanent fix.
REFUSED = "cannot be carried to a spawned worker"
FIX = ("pass what the dataset's code reads to its constructor and keep it on the dataset "
       "(or set it in worker_init_fn), not in a module global or class attribute that "
       "main() changes")
_LARGE = 1 << 20  # bytes: a value this large goes once through shared memory
_UNKNOWN = object()
_MISSING = object()
_tokens = itertools.count()  # tells a start's workers' files apart


# -- the library-wide settings ---------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Setting:
    """A process-wide setting a new interpreter resets and a worker's data
    depends on (``changes``: how), read where ``module`` is imported;
    ``default``: a new interpreter's, where it has it without the import."""

    label: str
    module: str
    changes: str
    read: Callable[[Any], Any]
    write: Callable[[Any, Any], None]
    default: Any = _UNKNOWN


def _decimal_context(decimal: Any) -> tuple[Any, ...]:
    c = decimal.getcontext()
    return (c.prec, c.rounding, c.Emin, c.Emax, c.capitals, c.clamp,
            tuple(sorted(t.__name__ for t, on in c.traps.items() if on)))


def _set_decimal_context(decimal: Any, value: tuple[Any, ...]) -> None:
    c = decimal.getcontext()
    c.prec, c.rounding, c.Emin, c.Emax, c.capitals, c.clamp, traps = value
    for trap in c.traps:
        c.traps[trap] = trap.__name__ in traps


def _attribute(name: str) -> tuple[Callable[[Any], Any], Callable[[Any, Any], None]]:
    return (lambda module: getattr(module, name),
            lambda module, value: setattr(module, name, value))


# What a dataset's samples depend on beyond its own code (docs/how-it-decides.md's
# table is made from it). Not here: the seeds (torch seeds each worker), torch's
# thread count (1 in a worker, by torch), the working directory, sys.path and the
# environment (spawn carries them), logging (DL219), warnings filters and print
# options (messages, not data), torch's default device (CUDA in a worker is its
# own choice), the recursion limit (it changes no value, only whether deep code
# raises, loudly; imports raise it, as jedi's under IPython 8 to 3000, not main()).
SETTINGS = (
    Setting("torch's default dtype", "torch",
            "the dtype of the tensors a worker makes from Python numbers "
            "(torch.set_default_dtype)",
            lambda t: t.get_default_dtype(), lambda t, v: t.set_default_dtype(v)),
    Setting("torch.use_deterministic_algorithms", "torch",
            "which kernels a worker's tensor code may use, and whether a "
            "nondeterministic one raises",
            lambda t: (t.are_deterministic_algorithms_enabled(),
                       t.is_deterministic_algorithms_warn_only_enabled()),
            lambda t, v: t.use_deterministic_algorithms(v[0], warn_only=v[1])),
    Setting("torch's float32 matmul precision", "torch",
            "the precision of float32 matrix products a worker computes "
            "(torch.set_float32_matmul_precision)",
            lambda t: t.get_float32_matmul_precision(),
            lambda t, v: t.set_float32_matmul_precision(v)),
    Setting("torch's sharing strategy", "torch.multiprocessing",
            "how a worker hands its batches over: file_system, set where file "
            "descriptors run out (torch.multiprocessing.set_sharing_strategy)",
            lambda m: m.get_sharing_strategy(), lambda m, v: m.set_sharing_strategy(v)),
    Setting("numpy's floating-point error handling", "numpy",
            "whether a worker's numpy overflow or invalid value raises, warns or "
            "passes (numpy.seterr)",
            lambda n: n.geterr(), lambda n, v: n.seterr(**v)),
    Setting("the decimal context", "decimal",
            "the precision, rounding and traps of a worker's Decimal arithmetic "
            "(decimal.getcontext())",
            _decimal_context, _set_decimal_context,
            default=(28, "ROUND_HALF_EVEN", -999999, 999999, 1, 0,
                     ("DivisionByZero", "InvalidOperation", "Overflow"))),
    Setting("PIL.Image.MAX_IMAGE_PIXELS", "PIL.Image",
            "the image size over which a worker's Image.open raises "
            "DecompressionBombError",
            *_attribute("MAX_IMAGE_PIXELS"), default=int(1024 * 1024 * 1024 // 4 // 3)),
    Setting("PIL.ImageFile.LOAD_TRUNCATED_IMAGES", "PIL.ImageFile",
            "whether a worker loads a truncated image or raises",
            *_attribute("LOAD_TRUNCATED_IMAGES"), default=False),
)
_SETTINGS = {s.label: s for s in SETTINGS}


# -- what is sent ----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Entry:
    """One value as a worker receives it (a ``Read``, or a setting by its label)
    and the training process's fingerprint of it (None: not taken)."""

    label: str
    module: str
    name: str
    site: str | None
    setting: bool
    fingerprint: str | None


def fingerprint(value: Any) -> str | None:
    return _measured(value)[0]


def _measured(value: Any, keep: bool = False) -> tuple[str | None, bool, int, bytes | None]:
    """``digest.measured``, but an open file by its name and mode (the worker's
    import opened its own, at its own offset, which is right), and a read-only
    map of a whole file by the file and the view, not a hash of the gigabytes
    it cannot change."""
    if is_file_object(value):
        return "file:%r:%r" % (getattr(value, "name", None),
                               getattr(value, "mode", None)), False, 0, None
    numpy = sys.modules.get("numpy")
    try:
        if numpy is not None and type(value) is numpy.memmap and value.mode == "r" \
                and isinstance(value.filename, str) and isinstance(value.base, mmap.mmap):
            st = os.stat(value.filename)
            return "memmap:%r:%d:%r:%s:%d:%d" % (
                value.filename, value.offset, value.shape, value.dtype.str, st.st_size,
                st.st_mtime_ns), False, 0, None
        return digest.measured(value, keep)
    except Exception:
        return None, False, 0, None


def _owner(module: str, name: str, importing: bool) -> tuple[Any, str] | None:
    """The object that holds ``name``'s last part (a module, a class), and that
    part; None where the module is not imported here (and not to be)."""
    target = sys.modules.get(digest.main_name(module))
    if target is None:
        if not importing:
            return None
        target = importlib.import_module(module)
    *path, last = name.split(".")
    if path:
        target = _namespace(target)[path[0]]
    for part in path[1:]:
        target = getattr(target, part)
    return target, last


def _value(module: str, name: str, importing: bool) -> Any:
    found = _owner(module, name, importing)
    if found is None:
        return _MISSING
    owner, last = found
    if isinstance(owner, types.ModuleType):
        return _namespace(owner).get(last, _MISSING)
    return getattr(owner, last, _MISSING)


@functools.cache
def _namespace(owner: Any) -> dict[str, Any]:
    """Where module ``owner``'s code reads its globals: in a spawned process
    (a worker, an ``mp.spawn`` rank) runpy's namespace that the script's
    functions keep, not the copy ``__mp_main__`` holds."""
    table = vars(owner)
    for value in list(table.values()):
        for function in [value] + (list(vars(value).values()) if isinstance(value, type)
                                   else []):
            scope = getattr(function, "__globals__", None)
            if type(function) is types.FunctionType and scope is not table and \
                    isinstance(scope, dict) and scope.get("__name__") == owner.__name__ and \
                    getattr(function, "__module__", None) == owner.__name__:
                return scope
    return table


def _current(entry: Entry, importing: bool = True) -> Any:
    """This process's value of ``entry``, or ``_MISSING`` (the import binds no
    such name). ``importing`` (a worker): its module imported where it is not,
    but a setting's whose default is what was sent; else a setting whose
    module is not imported raises (KeyError)."""
    if not entry.setting:
        return _value(entry.module, entry.name, importing)
    setting = _SETTINGS[entry.label]
    module = sys.modules.get(setting.module) if importing else sys.modules[setting.module]
    if module is None:
        if setting.default is not _UNKNOWN and fingerprint(setting.default) == entry.fingerprint:
            return _MISSING  # importing it later gives the training process's
        module = importlib.import_module(setting.module)
    return setting.read(module)


def _set(entry: Entry, value: Any) -> None:
    if entry.setting:
        setting = _SETTINGS[entry.label]
        setting.write(importlib.import_module(setting.module), value)
        return
    found = _owner(entry.module, entry.name, True)
    assert found is not None
    owner, name = found
    setattr(owner, name, value)
    if isinstance(owner, types.ModuleType):
        _namespace(owner)[name] = value


def mark(read: Read) -> tuple[Any, ...]:
    """What says cheaply that a value changed: the object, a container's length."""
    try:
        value = _value(read.module, read.name, False)
    except Exception:
        return ()
    return id(value), len(value) if type(value) in (list, dict, set) else None


class Carry:
    """A loader's carried state (``loaderstate.Kept.process_state``): what its
    workers' code reads, snapshot at each start of its workers (``start``);
    ``outcome()`` is DL220's ``Finding.needed``."""

    def __init__(self, reads: Sequence[Read], workers: int) -> None:
        self.reads = tuple(reads)
        self.workers = workers
        self.current: Carried | None = None
        self.said = False  # a start's workers carried something: its record was made
        self.record: Any = None  # that record (engine/loader.py), until it is made
        # id(array) -> (its fingerprint, the array, its copy in shared memory)
        self.shared: dict[int, tuple[str | None, Any, Any]] = {}

    def start(self, report_dir: str | None) -> Carried:
        """The values now (what the start before's workers said unasked is dropped)."""
        if self.current is not None:
            self.current.said()
        self.current = Carried(self.reads, report_dir, self.shared)
        return self.current

    def outcome(self) -> Said | bool:
        """DL220's record, from what the workers said; False where they set
        and refused nothing."""
        carried, refused = self.current.said() if self.current is not None else ([], [])
        if not (carried or refused):
            return False
        self.said = True
        shown = ["%s (%s)" % (e.label, e.site) if e.site else e.label for e in carried]
        done = "main() set %s its workers read; carried to each of %s: %s" % (
            number_of(len(carried), "value"), number_of(self.workers, "worker"),
            ", ".join(shown)) if carried else "main() set values its workers read"
        return Said(done, {"carried": [dataclasses.asdict(e) for e in carried],
                           "refused": refused})


class Carried:
    """One start's values: ``entries`` and ``values``, in order."""

    def __init__(self, reads: Sequence[Read], report_dir: str | None,
                 shared: dict[int, tuple[str | None, Any, Any]] | None = None) -> None:
        self.entries: list[Entry] = []
        self.values: list[Any] = []
        self.report_dir = report_dir
        self.prefix = "report-state-%d-%d-" % (os.getpid(), next(_tokens))
        self._shared = shared if shared is not None else {}
        # (pickles plainly, as the worker's own would; pickle's size; a large one's pickle)
        self._measures: list[tuple[bool, int, bytes | None]] = []
        self._sent: tuple[list[Any], dict[int, str]] | None = None
        for entry in [Entry(r.label, r.module, r.name, r.site, False, None) for r in reads] + \
                [Entry(s.label, s.module, s.label, None, True, None) for s in SETTINGS]:
            try:
                value = _current(entry, False)
            except Exception:  # a class the program deleted since, a setting's module
                continue       # not imported here or a torch without it: nothing to carry
            if value is _MISSING:
                continue
            mark, plain, size, pickled = _measured(value, True)
            self.entries.append(dataclasses.replace(entry, fingerprint=mark))
            self.values.append(value)
            self._measures.append((plain, size, pickled if size >= _LARGE else None))

    def sent(self) -> tuple[list[Any], dict[int, str]]:
        """The values for this start's workers and ``{index: why}`` for those
        that do not pickle (None in their place), made at the first worker's."""
        if self._sent is None:
            values = [self._as_sent(i) for i in range(len(self.values))]
            # the pickles are in shared memory now, where wanted
            self._measures = [(plain, size, None) for plain, size, _ in self._measures]
            unsent = {}
            for i, value in enumerate(values):
                if self._measures[i][0] or value is not self.values[i]:
                    continue  # the plain pickler wrote it whole: it pickles
                try:
                    WorkerPickler.dumps(value, pickle.HIGHEST_PROTOCOL)
                except Exception as exc:
                    unsent[i] = "it does not pickle (%s)" % shorten_line(
                        without_addresses(describe_exception(exc, 80)), 60)
                    values[i] = None
            self._sent = values, unsent
        return self._sent

    def _as_sent(self, i: int) -> Any:
        """The value as each worker gets it: a large one shared once for every
        worker, and again only where it changed."""
        value, mark = self.values[i], self.entries[i].fingerprint
        plain, size, pickled = self._measures[i]
        if mark is not None and mark.startswith("memmap:"):
            return _Shared(_remapped, value.filename, value.offset, value.shape,
                           value.dtype.str)
        numpy, torch = sys.modules.get("numpy"), sys.modules.get("torch")
        if torch is None or numpy is None or mark is None:
            return value
        array = type(value) is numpy.ndarray and not value.dtype.hasobject
        if not (array or plain) or (value.nbytes if array else size) < _LARGE:
            return value
        kept = self._shared.get(id(value))
        if kept is not None and kept[1] is value and kept[0] == mark:
            return kept[2]
        try:
            if not array and pickled is None:
                pickled = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
            shared = _Shared(_as_array, _in_shared_memory(torch, value)) if array else \
                _Shared(_Lazy, _in_shared_memory(torch, numpy.frombuffer(pickled,
                                                                         dtype=numpy.uint8)))
        except Exception:  # a dtype torch has not, no shared memory: in the pickle
            return value
        self._shared[id(value)] = (mark, value, shared)
        return shared

    def in_server(self) -> tuple[list[Entry], dict[int, Any]]:
        """For a build server (plain pickle): the values that pickle so, by
        index; the workers compare the others."""
        values = {}
        for i, value in enumerate(self.values):
            with contextlib.suppress(Exception):
                pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
                values[i] = value
        return list(self.entries), values

    def said(self) -> tuple[list[Entry], list[str]]:
        """The entries the workers set, and what they refused (read once: their
        files removed)."""
        said: dict[str, dict[str, None]] = {"carried": {}, "refused": {}}  # each once, in order
        with contextlib.suppress(OSError):
            for name in os.listdir(self.report_dir) if self.report_dir is not None else ():
                if not name.startswith(self.prefix):
                    continue
                path = os.path.join(self.report_dir or "", name)
                with contextlib.suppress(OSError):
                    with open(path) as f:
                        lines = f.read().splitlines()
                    for how, _tab, what in (line.partition("\t") for line in lines):
                        if how in said:
                            said[how][what] = None
                    os.unlink(path)
        return [e for e in self.entries if e.label in said["carried"]], list(said["refused"])


def _in_shared_memory(torch: Any, array: Any) -> Any:
    """A tensor of torch's own in shared memory holding ``array``'s values (one
    copy: torch shares only the storages it allocated)."""
    dtype = torch.from_numpy(array[:0].copy()).dtype  # an empty copy: writable, no warning
    tensor = torch.empty(array.shape, dtype=dtype).share_memory_()
    tensor.numpy()[...] = array
    return tensor


class _Shared:
    """A value sent as ``make(*args)``: a large array as one in shared memory
    (``_as_array``), another large value as its pickle there, loaded only where
    the worker's own differs (``_Lazy``); a read-only map of a whole file
    (``np.load(mmap_mode="r")``) mapped again by its path, as fork shares its pages."""

    def __init__(self, make: Callable[..., Any], *args: Any) -> None:
        self.make, self.args = make, args
        self.tensor = args[0]  # a large value's: in shared memory

    def __reduce__(self) -> tuple[Any, ...]:
        return self.make, self.args


def _as_array(tensor: Any) -> Any:
    return tensor.numpy()


class _Lazy:
    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor

    def load(self) -> Any:
        return pickle.loads(memoryview(self.tensor.numpy()))


def _remapped(filename: str, offset: int, shape: tuple[int, ...], dtype: str) -> Any:
    import numpy  # noqa: PLC0415 - optional dependency (numpy): only where the training process mapped an array

    return numpy.memmap(filename, dtype=dtype, mode="r", offset=offset, shape=shape)


class StateFirst(int):
    """torch's dataset kind (an int) as sent to a worker: the state first."""

    carried: Carried

    def __new__(cls, kind: int, carried: Carried) -> StateFirst:
        made = super().__new__(cls, kind)
        made.carried = carried
        return made

    def __reduce__(self) -> tuple[Any, ...]:
        carried = self.carried
        values, unsent = carried.sent()
        report = None if carried.report_dir is None else \
            os.path.join(carried.report_dir, carried.prefix)
        return arrive, (carried.entries, values, unsent, report, int(self))


# -- in the worker -------------------------------------------------------------------

_refused: list[str] = []       # in a worker: the values that differ and did not come
_set_here: dict[str, str] = {}  # label -> fingerprint: set in this process (or its server)


def arrive(entries: list[Entry], values: list[Any], unsent: dict[int, str],
           report: str | None, kind: int) -> int:
    """In a worker, before the dataset is unpickled: the training process's
    value of each entry where its own differs. Returns torch's dataset kind."""
    refused = len(_refused)
    try:
        carried = _arrive(entries, values, unsent)
    except Exception as exc:  # ours: the worker refuses before its first batch
        _refused.append("the process state could not be carried (%s)" % describe_exception(
            exc, 120))
        carried = []
    # each value it has as the training process's (set here or in its server), each refused
    labels = list(dict.fromkeys(carried + list(_set_here)))
    if report is not None and (labels or _refused[refused:]):
        tell("%s%d.txt" % (report, os.getpid()),
             "".join("carried\t%s\n" % label for label in labels) +
             "".join("refused\t%s\n" % " ".join(why.split()) for why in _refused[refused:]),
             os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0))
    return kind


def _arrive(entries: list[Entry], values: Any, unsent: dict[int, str]) -> list[str]:
    differing = []
    for i, entry in enumerate(entries):
        try:
            own = _current(entry)
        except Exception:  # its module does not import here: no value of its own
            own = _MISSING
        if own is _MISSING and entry.setting:
            continue
        if entry.fingerprint is None or own is _MISSING or \
                fingerprint(own) != entry.fingerprint:
            differing.append((i, entry))
    carried = []
    for i, entry in differing:
        if i in unsent:
            _refused.append("%s%s %s: %s" % (
                entry.label, " (%s)" % shown_site(entry.site) if entry.site else "", REFUSED,
                unsent[i]))
            continue
        value = values[i]
        _set(entry, value.load() if isinstance(value, _Lazy) else value)
        _set_here[entry.label] = entry.fingerprint or ""
        carried.append(entry.label)
    return carried


def arrive_in_server(entries: list[Entry], values: dict[int, Any]) -> None:
    """In a build server, before it builds (``Carried.in_server``): its
    children inherit the values."""
    unsent = {i: "" for i in range(len(entries)) if i not in values}  # the workers say why
    with contextlib.suppress(Exception):  # each worker compares again
        _arrive(entries, values, unsent)
    del _refused[:]  # each worker refuses for itself


def refuse_in_worker(worker_id: int) -> None:
    """Worker step: a value that differs and did not come stops the worker."""
    if _refused:
        raise RemedyFailed("; ".join(_refused))


def tell(path: str | None, text: str, flags: int = os.O_APPEND) -> None:
    """In a worker: ``text`` written to a file the training process reads (DL219's,
    DL220's); not where that fails (gone: nobody waits for it any more)."""
    if path is None:
        return
    try:
        fd = os.open(path, os.O_WRONLY | flags, 0o600)
    except OSError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(text)
