"""The one place that touches torch's privates: its DataLoader iterator loop
(``torch.utils.data.dataloader``, ``_utils``), a tensor's storage and hooks,
an autocast's state. A release may rename a method, an attribute or an
error's words, so everything of ours that depends on them goes through here
(or the copy of torch's loop, ``remedies/emulated_workers.py``). Nothing here
imports the rest of the package. ``tests/test_torch_private.py`` pins each
piece on every torch supported; ``watched_missing`` and ``emulated_missing``
check names and shapes once per process, so that a torch that moved them
gets its own iterator and one line saying why.

NOTE [the data flow of a repaired loader]

1. Parent. ``DataLoader.__iter__`` -> ``_get_iterator`` (patched: the rules
   set the loader's arguments, ``engine/loader.py``) -> ``Watched``
   (``recovery/rungs.py: real_workers``), whose ``worker_init_fn`` runs our
   steps first (``remedies/workerinit.py``: the worker's own file
   descriptions, ``remedies/isolation.py``; faulthandler into a file of
   ours, ``inspection/diagnostics.py``). torch's ``__init__`` draws the base
   seed, pickles the loader's parts for each worker (spawn; fork copies
   them) through the repairs' reducers, the process state first (DL220:
   ``dataset_kind_as``), starts the workers and sends each
   ``prefetch_factor`` indices, round robin, drawn through a ``Recorder``.
2. Server. Under DL209 a warm fork server that imported torch and the
   dataset's libraries forks the workers (``remedies/warmstart.py``,
   ``warmserver.py``); each child starts as spawn does, first with its own
   description of each file the server holds open
   (``isolation.after_fork_in_server_child``).
3. Worker. It unpickles the training process's values where its own import
   left others (``process_state.arrive``), then the dataset. torch's
   ``_worker_loop`` seeds ``base_seed + id`` (random, torch, numpy), sets
   ``get_worker_info()``, runs ``worker_init_fn`` (our steps, then the
   user's), then fetches and collates each batch onto the result queue
   (tensors through shared memory). A worker that cannot unpickle what it
   was sent dies before its steps run, its traceback at
   ``diagnostics.bootstrap_path``.
4. Report back. The parent's ``_get_data`` polls the queue (``Watch.limit``,
   ``observed``); ``_process_data`` tells the watch which worker delivered
   (``Watch.delivered_by``; torch 2.0: ``_WatchedAtIndex``): once each did,
   the records waiting on the workers are made ("fixed": the remedy held).
   A death, a silence past the limit or a shared-memory/open-file error
   becomes a ``Failure`` (``Watch.failed``, ``hung``); the recovery
   (``recovery/iterator.py``) builds the next rung's iterator with the same
   base seed and the recorded indices (``Resume``) and replays. As the
   workers exit, what they read through their own descriptions comes back
   (``Watch.shut_down`` -> ``isolation.Outcome``) for ``dataloader.outcome``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import operator
import pickle
import re
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Callable, NamedTuple

import torch
from torch._utils import ExceptionWrapper  # noqa: F401 (a worker's error, as torch wraps it)
from torch.utils.data import dataloader as _dataloader
from torch.utils.data._utils import pin_memory as _pin_memory
from torch.utils.data._utils import signal_handling as _signal_handling
from torch.utils.data._utils import worker as _worker_module
from torch.utils.data._utils.collate import default_collate

# -- the classes and names, as this torch has them (None where it has not; Any) --

MultiProcessIter: Any = getattr(_dataloader, "_MultiProcessingDataLoaderIter", None)
BaseIter: Any = getattr(_dataloader, "_BaseDataLoaderIter", object)
DatasetKind: Any = getattr(_dataloader, "_DatasetKind", None)
DATAPIPES = tuple(c for c in (getattr(_dataloader, "IterDataPipe", None),
                              getattr(_dataloader, "MapDataPipe", None)) if c is not None)
ITER_DATAPIPE: Any = getattr(_dataloader, "IterDataPipe", ())
WorkerInfo: Any = getattr(_worker_module, "WorkerInfo", None)
IterableStop: Any = getattr(_worker_module, "_IterableDatasetStopIteration", ())
sharding_worker_init_fn: Any = getattr(_dataloader, "_sharding_worker_init_fn", None)
# (kind, dataset, auto_collation, collate_fn, drop_last) -> a worker's fetcher
create_fetcher: Any = getattr(DatasetKind, "create_fetcher", None)

# torch's own words, raised as torch raises them or read from its errors.
TIMED_OUT = "DataLoader timed out after %s seconds"
PIN_THREAD_EXITED = "Pin memory thread exited unexpectedly"
_WORKER_WORDS = re.compile(r"in DataLoader worker process (\d+)")
PIN_MEMORY_WARNING = "'pin_memory' argument is set as true"


def has_numpy() -> bool:
    """Whether torch's workers seed numpy (torch imported it)."""
    return bool(getattr(_worker_module, "HAS_NUMPY", False))


def numpy_seed(base_seed: int, worker_id: int) -> Any:
    """The numpy seed ``_worker_loop`` gives worker ``worker_id``."""
    return _worker_module._generate_state(base_seed, worker_id)


def is_iterable_kind(kind: Any) -> bool:
    return kind == DatasetKind.Iterable


def pin_memory_module() -> Any:
    """The module that holds torch's pin step (``pin_memory``), which DL305 wraps."""
    return _pin_memory


def worker_named_in(text: str) -> int | None:
    """The worker id torch names in a re-raised worker error, or None."""
    found = _WORKER_WORDS.search(text)
    return int(found.group(1)) if found else None


def warns_pin_memory_without_accelerator() -> bool:
    """Whether torch's iterator warns about pin_memory without an accelerator:
    read from its code's constants, not from the version number."""
    consts = BaseIter.__init__.__code__.co_consts
    return any(isinstance(c, str) and PIN_MEMORY_WARNING in c for c in consts)


@functools.cache
def storages_keep_their_python_object() -> bool:
    """Whether a storage's Python object lives as long as the storage (torch >=
    2.1), so that a weak reference to it is safe. torch 2.0 makes a new one at
    each call and frees it without clearing its weak references: a
    ``WeakValueDictionary`` of storages segfaults when a freed one's entry is replaced."""
    probe = torch.empty(1)
    return probe.untyped_storage() is probe.untyped_storage()


# The DataLoader method that makes each iterator (patches/dataloader.py wraps it).
GET_ITERATOR = "_get_iterator"


def original_get_iterator() -> Callable[..., Any] | None:
    """torch's ``DataLoader._get_iterator`` under the wrapper of ours."""
    return getattr(_dataloader.DataLoader.__dict__.get(GET_ITERATOR), "__wrapped__", None)


def is_worker_loop(target: Any) -> bool:
    """Whether a process's target is torch's ``_worker_loop``: a DataLoader worker."""
    return getattr(target, "__name__", None) == "_worker_loop" and \
        getattr(target, "__module__", "").startswith("torch.utils.data")


def iterator_class_is_torchs() -> bool:
    """Whether nobody replaced ``_MultiProcessingDataLoaderIter``, the class we subclass."""
    return getattr(_dataloader, "_MultiProcessingDataLoaderIter", None) is MultiProcessIter


# -- torch's objects: a tensor's storage, an autocast -----------------------------

def storage_id(tensor: Any) -> int:
    """The same number for every tensor that views one storage, as long as it
    lives (its C object's address)."""
    return tensor.untyped_storage()._cdata


def autocast_enabled(autocast: Any) -> bool:
    """Whether an autocast object (made, not entered) stays enabled: torch
    disables it, with a warning, for a dtype its device cannot do."""
    return bool(getattr(autocast, "_enabled", True))


# -- get_worker_info() ----------------------------------------------------------

current_worker_info: Callable[[], Any] = functools.partial(getattr, _worker_module, "_worker_info")
set_worker_info: Callable[[Any], None] = functools.partial(setattr, _worker_module, "_worker_info")


@contextlib.contextmanager
def _set_while(owner: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def collate_in_process(batch: Any) -> Any:
    """torch's ``default_collate`` without its shared-memory output (in a
    worker it writes into /dev/shm, but an emulated worker is in the main
    process, and /dev/shm may be what failed): ``get_worker_info()`` is None
    for its length only."""
    with _set_while(_worker_module, "_worker_info", None):
        return default_collate(batch)


def multiprocessing_context_as(loader: Any, context: Any) -> AbstractContextManager[None]:
    """While an iterator of ``loader`` is made (torch reads the loader's
    ``multiprocessing_context`` there only), its queues, events and processes
    come from ``context``: set past the property's check, which accepts only
    a stdlib context."""
    return _set_while(loader, "_DataLoader__multiprocessing_context", context)


# -- what a worker is sent first --------------------------------------------------

def dataset_kind_as(loader: Any, make: Callable[[int], int]) -> AbstractContextManager[None]:
    """While an iterator of ``loader`` is made, its dataset kind (an int) is
    ``make(kind)``: torch sends it to each worker before the dataset, so an
    int subclass of ours (``process_state.StateFirst``) pickles as the carried
    process state, then the kind; torch compares the kind by value (``==``)."""
    return _set_while(loader, "_dataset_kind", make(loader._dataset_kind))


# -- an iterator's fields (and a tensor's) -----------------------------------------

def _field(name: str, default: Any) -> Callable[[Any], Any]:
    return lambda owner: getattr(owner, name, default)


# A multi-process iterator's worker processes (none before it started), the
# batches it sent, its pin thread; the hooks register_hook put on a tensor.
worker_processes: Callable[[Any], Sequence[Any]] = _field("_workers", ())
batches_sent: Callable[[Any], int] = _field("_send_idx", 0)
pin_memory_thread: Callable[[Any], Any] = _field("_pin_memory_thread", None)
backward_hooks: Callable[[Any], Any] = _field("_backward_hooks", None)  # None or empty: none
base_seed: Callable[[Any], int] = operator.attrgetter("_base_seed")
# The next batch, as ``__next__`` fetches it but not counted as yielded (a replay).
fetch_next: Callable[[Any], Any] = operator.methodcaller("_next_data")
shut_down: Callable[[Any], None] = operator.methodcaller("_shutdown_workers")


def dead_workers(iterator: Any) -> list[tuple[int, Any]]:
    """``[(worker id, process)]`` of workers that exited, but cleanly after
    their IterableDataset ended."""
    return [(i, w) for i, w in enumerate(iterator._workers)
            if w.exitcode is not None and (w.exitcode != 0 or iterator._workers_status[i])]


def awaited_worker(iterator: Any) -> int | None:
    return (iterator._task_info.get(iterator._rcvd_idx) or (None,))[0]


def set_yielded(iterator: Any, count: int) -> None:
    iterator._num_yielded = count


def next_epoch(iterator: Any, loader: Any, first_iter: bool = False) -> Any:
    """A persistent loader's next epoch on the iterator it keeps."""
    return iterator._reset(loader, first_iter)


# -- recording the sampler, and resuming at a batch ------------------------------

class Recorder:
    """The epoch's sampler iterator, remembering what it gave, for a new
    iterator to take again before it draws on."""

    __slots__ = ("live", "drawn")

    def __init__(self, live: Iterator[Any]) -> None:
        self.live = live
        self.drawn: list[Any] = []

    def __iter__(self) -> Recorder:
        return self

    def __next__(self) -> Any:
        index = next(self.live)
        self.drawn.append(index)
        return index

    def again(self) -> Iterator[Any]:
        return itertools.chain(list(self.drawn), self)


class Resume(NamedTuple):  # where a new iterator resumes
    base_seed: int
    recorder: Recorder


class _LoaderView:
    """The loader as ``_BaseDataLoaderIter.__init__`` reads it, with no sampler
    to start (its ``__iter__`` may draw) and a throwaway generator for the
    base seed (the old one's is kept): the parent's random states stay as an
    uninterrupted run leaves them."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self._index_sampler: Iterable[Any] = ()
        self.generator = torch.Generator()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class Recording(BaseIter):
    """Between a torch iterator class and ``_BaseDataLoaderIter``: each epoch's
    sampler iterator is a ``Recorder`` (``watch.recorder``); given a ``Resume``,
    it starts with its base seed and the indices drawn so far."""

    _autosafe_resume: Resume | None = None
    _autosafe_watch: Any = None  # the recovery's Watch
    # torch's, set by _BaseDataLoaderIter
    _sampler_iter: Iterator[Any]

    def __init__(self, loader: Any) -> None:
        resume = self._autosafe_resume
        if resume is None:
            super().__init__(loader)
            return
        super().__init__(_LoaderView(loader))
        self._index_sampler = loader._index_sampler
        self._base_seed = resume.base_seed

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        resume, watch = self._autosafe_resume, self._autosafe_watch
        if resume is None:
            super()._reset(loader, first_iter)
            self._sampler_iter = watch.recorder = Recorder(self._sampler_iter)
            return
        self._autosafe_resume = None
        watch.recorder = resume.recorder
        self._sampler_iter = resume.recorder.again()
        self._num_yielded = 0
        self._IterableDataset_len_called = loader._IterableDataset_len_called


# -- the watched multi-process iterator --------------------------------------------

# torch's (>= 2.8) advice when a worker's start fails to pickle, attributed to the
# iterator __init__'s caller: here, Watched.__init__, whose recovery takes the
# next rung instead (its record says what failed). Other iterators' stay.
warnings.filterwarnings("ignore", message="Got pickle error when attempting to start a worker",
                        category=UserWarning, module=re.escape(__name__) + "$")


# (bases chosen at import: mypy cannot read them, and sees Any)
class _Watched(*((MultiProcessIter, Recording)  # type: ignore[misc]
                 if MultiProcessIter else (Recording,))):
    """torch's iterator, with the sampler's indices recorded, deaths left to
    the watch (out of torch's SIGCHLD table) and a watchdog on every wait.
    ``watch`` (``recovery/watch.py``) decides; this class runs torch's loop,
    calling its hooks. ``poll_s``: how often a wait looks at the workers."""

    # Until torch's __init__ sets it, no worker has started: an iterator that
    # could not start (no file descriptor for its queues) has nothing to stop.
    _shutdown = True
    _worker_pids_set: bool  # torch's, as its __init__ sets them
    _sampler_iter: Iterator[Any]

    def __init__(self, loader: Any, watch: Any, resume: Resume | None = None,
                 poll_s: float = 0.1) -> None:
        self._autosafe_watch = watch
        self._autosafe_resume = resume
        self._autosafe_poll_s = poll_s
        watch.starting()
        try:
            super().__init__(loader)
        except (TypeError, AttributeError, pickle.PicklingError) as exc:
            # torch's own catch around each worker's start (its _workers list
            # is made just before, and _send_idx at the end by _reset)
            starting = "_workers" in vars(self) and "_send_idx" not in vars(self)
            instead = watch.start_failed(self, exc) if starting else None
            if instead is None:
                raise
            if self._autosafe_resume is None:
                # The epoch's sampler iterator, recorded, as torch's _reset would
                # have begun it (the base seed was drawn already), for the rung
                # that goes on from it; a resumed one goes on from its recorder.
                Recording._reset(self, loader, True)
            raise instead from exc

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        if first_iter and self._worker_pids_set:
            # Deaths are the watch's: torch's SIGCHLD handler would raise
            # wherever the main thread is (inside loss.backward()).
            _signal_handling._remove_worker_pids(id(self))
            self._worker_pids_set = False
        super()._reset(loader, first_iter)

    def _shutdown_workers(self) -> None:
        try:
            super()._shutdown_workers()
        finally:
            self._autosafe_watch.shut_down(getattr(self, "_workers", ()))

    def _get_data(self) -> Any:
        watch = self._autosafe_watch
        limit = watch.limit()
        start = time.monotonic()
        while True:
            try:
                success, data = self._try_get_data(self._autosafe_poll_s)
            except Exception as exc:
                instead = watch.failed(self, exc)
                if instead is None:
                    raise
                raise instead from None
            if success:
                watch.observed(time.monotonic() - start)
                return data
            if self._pin_memory and not self._pin_memory_thread.is_alive():
                raise RuntimeError(PIN_THREAD_EXITED)
            waited = time.monotonic() - start
            if self._timeout > 0 and waited >= self._timeout:
                # The user's own limit: torch's error, as torch raises it; no recovery.
                raise RuntimeError(TIMED_OUT % self._timeout)
            if limit is not None and waited >= limit:
                worker = awaited_worker(self)
                pid = self._workers[worker].pid if worker is not None else None
                raise watch.hung(worker, pid, waited)


class _WatchedByWorker(_Watched):
    """torch >= 2.1: ``_process_data(data, worker_idx)`` names the worker that
    delivered."""

    def _process_data(self, data: Any, worker_idx: int) -> Any:
        self._autosafe_watch.delivered_by(worker_idx)
        return super()._process_data(data, worker_idx)


class _WatchedAtIndex(_Watched):
    """torch 2.0: ``_process_data(data)`` names no worker, but runs while
    ``_rcvd_idx`` is the index delivered; ``_try_put_index`` records each
    index's worker in ``_task_info[_send_idx]``, which ``_next_data`` drops
    before the call: so it is kept here until its batch is delivered."""

    _autosafe_sent: dict[int, int]

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        self._autosafe_sent = {}  # torch's _reset starts _send_idx at 0 and sends
        super()._reset(loader, first_iter)

    def _try_put_index(self) -> None:
        sent = self._send_idx
        super()._try_put_index()
        if self._send_idx != sent:
            self._autosafe_sent[sent] = self._task_info[sent][0]

    def _process_data(self, data: Any) -> Any:
        worker = self._autosafe_sent.pop(self._rcvd_idx, None)
        if worker is not None:
            self._autosafe_watch.delivered_by(worker)
        return super()._process_data(data)


# -- whether this torch has them: names and shapes, checked once per process ------

# _MultiProcessingDataLoaderIter's methods Watched calls or overrides, with the
# parameters it passes (_process_data's: delivery_shape).
WATCHED_METHODS = {"_try_get_data": ("timeout",), "_get_data": (), "_shutdown_workers": (),
                   "_reset": ("loader", "first_iter"), "_next_data": (), "_try_put_index": ()}
# Attributes read here, set by torch's iterators' __init__ or _reset.
WATCHED_ATTRIBUTES = ("_task_info", "_rcvd_idx", "_send_idx", "_workers", "_worker_pids_set",
                      "_pin_memory", "_workers_status", "_timeout", "_num_yielded",
                      "_sampler_iter", "_index_sampler", "_base_seed")
# What the emulated workers (torch's loop copied onto _BaseDataLoaderIter) take
# from torch, checked by emulated_missing: the fields the base's __init__/_reset
# set, the methods they call or override (tests/test_torch_private.py: every one
# the loop reads), the worker module's names for a worker's identity and seeds.
EMULATED_ATTRIBUTES = ("_dataset_kind", "_auto_collation", "_drop_last", "_collate_fn",
                       "_dataset", "_index_sampler", "_sampler_iter", "_num_yielded",
                       "_base_seed", "_pin_memory", "_num_workers", "_persistent_workers",
                       "_shared_seed", "_world_size", "_rank", "_pin_memory_device")
EMULATED_METHODS = ("_next_index", "_reset")
WORKER_MODULE = ("_worker_info", "WorkerInfo", "_generate_state",
                 "_IterableDatasetStopIteration", "HAS_NUMPY")
DATALOADER_MODULE = ("_BaseDataLoaderIter", "_MultiProcessingDataLoaderIter", "_DatasetKind",
                     "_sharding_worker_init_fn")


def _once(check: Callable[[], list[str]]) -> Callable[[], str]:
    """What ``check`` finds this torch lacks, joined ("" where nothing), once per process."""
    @functools.cache
    def missing() -> str:
        try:
            return ", ".join(check())
        except Exception as exc:  # a torch we cannot even look at: not ours to use
            return "torch.utils.data (%s)" % type(exc).__name__
    return functools.update_wrapper(missing, check)


@_once
def dataset_kind_missing() -> list[str]:
    """What ``dataset_kind_as`` needs: the loader's ``_dataset_kind``, which
    its iterators take."""
    return _set_by(_dataloader.DataLoader, ("_dataset_kind",)) + \
        _set_by(BaseIter, ("_dataset_kind",))


@_once
def watched_missing() -> list[str]:
    missing = _names(_dataloader, DATALOADER_MODULE, "torch.utils.data.dataloader")
    missing += _names(_signal_handling, ("_remove_worker_pids",), "signal_handling")
    cls = getattr(_dataloader, "_MultiProcessingDataLoaderIter", None)
    if cls is None:
        return missing
    for name, params in WATCHED_METHODS.items():
        method = getattr(cls, name, None)
        if not callable(method) or not _takes(method, params):
            missing.append("%s.%s(%s)" % (cls.__name__, name, ", ".join(params)))
    if delivery_shape(cls) is None:
        missing.append("%s._process_data(data, worker_idx)" % cls.__name__)
    missing += _set_by(cls, WATCHED_ATTRIBUTES)
    return missing


def delivery_shape(cls: Any) -> str | None:
    """``"worker"``: ``cls._process_data(data, worker_idx)`` (torch >= 2.1);
    ``"index"``: torch 2.0's (``_WatchedAtIndex``); None for any other shape."""
    process = getattr(cls, "_process_data", None)
    if not callable(process):
        return None
    if _takes(process, ("data", "worker_idx")):
        return "worker"
    put = getattr(cls, "_try_put_index", None)
    if _params(process) == ["data"] and "_rcvd_idx" in _code_names(process) \
            and {"_task_info", "_send_idx"} <= _code_names(put):
        return "index"
    return None


def _params(function: Callable[..., Any]) -> list[str] | None:
    """A method's parameters after ``self`` (None where they cannot be read)."""
    try:
        return list(inspect.signature(function).parameters)[1:]
    except (TypeError, ValueError):
        return None


def _code_names(function: Any) -> set[str]:
    """The names a function's code reads and sets (attributes among them)."""
    code = getattr(function, "__code__", None)
    return set(code.co_names) if code is not None else set()


@_once
def emulated_missing() -> list[str]:
    missing = _names(_dataloader, DATALOADER_MODULE, "torch.utils.data.dataloader")
    missing += _names(_worker_module, WORKER_MODULE, "torch.utils.data._utils.worker")
    base = getattr(_dataloader, "_BaseDataLoaderIter", None)
    if base is not None:
        missing += _set_by(base, EMULATED_ATTRIBUTES)
        missing += ["%s.%s" % (base.__name__, name) for name in EMULATED_METHODS
                    if not callable(getattr(base, name, None))]
    return missing


def _names(module: Any, names: Iterable[str], shown: str) -> list[str]:
    return ["%s.%s" % (shown, name) for name in names if not hasattr(module, name)]


def _takes(function: Callable[..., Any], params: Iterable[str]) -> bool:
    accepted = _params(function)
    return accepted is not None and all(p in accepted for p in params)


def _set_by(cls: type, attributes: Iterable[str]) -> list[str]:
    """``cls.attr`` for each attribute no ``__init__``/``_reset`` of ``cls`` or
    its bases names."""
    named: set[str] = set()
    for klass in cls.__mro__:
        for method in ("__init__", "_reset"):
            named |= _code_names(klass.__dict__.get(method))
    return ["%s.%s" % (cls.__name__, a) for a in attributes if a not in named]


# The watched iterator for this torch's delivery shape (where it has neither, the
# recovery never builds one: watched_missing() names _process_data).
Watched: type[_Watched] = (_WatchedAtIndex if delivery_shape(MultiProcessIter) == "index"
                           else _WatchedByWorker)


# Loaded: the patches that read this module may apply now, those whose trigger
# (torch) was imported by this module's own ``import torch`` included.
LOADED = True
if "autosafe_torch.patches" in sys.modules:  # no patch waits where the shim never loaded
    sys.modules["autosafe_torch.patches"].apply_deferred()
