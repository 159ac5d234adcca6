"""Recover from a failure of a loader's workers: same batches, none lost or repeated.

``watched(loader, wrapped, args, kwargs)`` builds the multi-process iterator
torch would build, watched, inside a ``RecoveringIter``:

- Deaths are ours to handle. torch's SIGCHLD handler raises wherever the
  main thread is (inside ``loss.backward()``), so our workers' pids are
  taken out of its table; a death is found when a batch is awaited
  (``_get_data`` polls every ``POLL_S``), and so is a shared-memory or
  open-file failure (torch's words, or a bus error).
- A watchdog: no batch for ``limit()`` seconds while every worker lives is
  a hang. The limit is ``AUTOSAFE_TORCH_HANG_TIMEOUT`` (default 60 s), or
  ``HANG_FACTOR`` times the slowest wait seen, or the loader's own
  ``timeout``, whichever is longest; ``STARTUP_FACTOR`` times more while
  workers start.
- Each worker runs faulthandler into a file of ours (a step of its
  ``worker_init_fn``, for that iterator only): a crash leaves its Python
  traceback there, and ``SIGUSR1`` makes it write every thread's stack,
  which is how a hang is explained.
- Then the iterator is rebuilt on the next rung (``rules/recovery.py``:
  new workers, fewer batches in flight, file_system sharing, emulated
  workers) and resumes at the first batch not yet delivered.

Exact by replay. A worker's random state after n fetches is known only by
making them, so the new iterator is the old one again: the same base seed
(each worker is seeded ``base_seed + id``), the sampler's indices recorded
as they were sent and then the old sampler iterator itself (never drawn
twice), the same round-robin dispatch; the batches already delivered are
fetched again and dropped. Every batch then reaches the user once, in the
order and with the content of a run without the failure, including
per-worker RNG state, ``worker_init_fn`` effects and IterableDataset
shards. Skipping instead of replaying would be exact only for datasets
that draw nothing. Not exact, and said so in the record: a persistent
loader after its first epoch (its workers' states carried over from
earlier epochs are not replayed). Side effects outside the worker (a file
the dataset appends to) happen again for the replayed fetches. Not
watched: ``in_order=False`` (which batches were delivered depends on
timing) and DataPipes.
"""

import functools
import itertools
import logging
import multiprocessing.process
import os
import re
import sys
import time
import weakref

import torch
import wrapt
from torch.utils.data import dataloader as _dataloader
from torch.utils.data._utils import signal_handling
from torch.utils.data._utils import worker as _worker_module
from torch.utils.data._utils.collate import default_collate

from .. import callsite, engine
from ..config import CONFIG
from ..inspection import failures as F
from ..rules import recovery as ladder_rules
from ..remedies.dumps import (DUMP_SIGNAL, bootstrap_path, dump_dir, dump_path,
                    faulthandler_in_worker, read as _read)
from ..remedies import isolation
from ..errors import NoExactRung
from ..remedies.emulated_workers import EmulatedWorkersIter
from ..remedies.limits import file_system_sharing, use_file_system_sharing
from ..remedies.workerinit import with_step
from . import torch_seams

POLL_S = 0.1          # how often a waiting iterator looks at its workers
HANG_FACTOR = 10      # the limit, in slowest waits seen
STARTUP_FACTOR = 3    # while workers start (spawn imports torch in each) ...
STARTUP_MIN_S = 30.0  # ... and at least this (measured: 6 s for 2 spawn workers, busy 2 cores)
DUMP_WAIT_S = 1.0     # for the hung workers' stacks to be written
DEATH_WAIT_S = 0.5    # for a death behind a broken connection to show

_MP_ITER = _dataloader._MultiProcessingDataLoaderIter


class _Failed(Exception):
    """A failure of the workers, on its way from ``_get_data`` to ``RecoveringIter``."""

    def __init__(self, failure):
        super().__init__(failure)
        self.failure = failure


# -- the watched torch iterator -------------------------------------------------


class _Watch:
    """What a ``RecoveringIter`` keeps across its inner iterators (it refers to
    neither, so that dropping the iterator still shuts its workers down):
    the sampler's indices drawn this epoch, the slowest wait seen, the limits;
    the records waiting for the workers to show that their remedies held
    (``pending``: every worker delivered a batch, ``delivered``), and where
    the workers report what they had of their own (``outcome``)."""

    __slots__ = ("recorder", "slowest", "fresh", "floor", "timeout", "kinds", "dumps",
                 "pending", "delivered", "workers", "outcome")

    def __init__(self, kinds, floor, timeout, pending=(), workers=0, outcome=None):
        self.recorder = None
        self.slowest = 0.0
        self.fresh = True
        self.kinds = kinds
        self.floor = floor if F.HUNG in kinds else 0
        self.timeout = timeout if timeout and timeout > 0 else 0
        self.dumps = None
        self.pending = list(pending)
        self.delivered = set()
        self.workers = workers
        self.outcome = outcome

    def limit(self):
        """Seconds to wait for one batch, or None: forever (torch's default)."""
        if not self.floor:
            return self.timeout or None
        limit = max(self.floor, HANG_FACTOR * self.slowest, self.timeout)
        return max(limit, STARTUP_FACTOR * self.floor, STARTUP_MIN_S) if self.fresh else limit

    def observed(self, waited):
        if self.fresh:
            self.fresh = False  # a worker start is no batch time
        elif waited > self.slowest:
            self.slowest = waited

    def delivered_by(self, worker):
        """Worker ``worker`` handed over a batch: it started, with every step of ours."""
        if self.pending:
            self.delivered.add(worker)
            if len(self.delivered) >= self.workers:
                self.held()

    def held(self):
        """Every worker delivered (or the epoch ended): the pending records hold."""
        pending, self.pending = self.pending, []
        record_held(pending)

    def did_not_hold(self, failure):
        """The workers failed before they showed it: a remedy they could not
        apply, or a start that failed (unpickling what the repairs sent), makes
        the pending records fixes that did not hold."""
        if self.pending and (failure.kind == F.REMEDY or failure.starting):
            pending, self.pending = self.pending, []
            engine.decide_or(None, "DataLoader records", _record_failed, pending, failure)


def record_held(pending):
    if pending:
        engine.decide_or(None, "DataLoader records", _record_all, pending)


def _record_all(pending):
    for intervention in pending:
        engine.record_outcome(intervention)


def _record_failed(pending, failure):
    for intervention in pending:
        engine.record_outcome(intervention, failed=failure.what())


# -- recording, and resuming at a batch: the same seeds, the same indices -------


class _Recorder:
    """The epoch's sampler iterator, remembering what it gave: a new iterator
    takes these again, then goes on drawing from the same sampler."""

    __slots__ = ("live", "drawn")

    def __init__(self, live):
        self.live = live
        self.drawn = []

    def __iter__(self):
        return self

    def __next__(self):
        index = next(self.live)
        self.drawn.append(index)
        return index

    def again(self):
        return itertools.chain(list(self.drawn), self)


class _Resume:
    __slots__ = ("base_seed", "recorder")

    def __init__(self, base_seed, recorder):
        self.base_seed = base_seed
        self.recorder = recorder


class _LoaderView:
    """The loader as ``_BaseDataLoaderIter.__init__`` reads it, but with no
    sampler to start (a sampler's ``__iter__`` may draw) and a throwaway
    generator for the base seed, which is the old one's: the parent's
    random states stay as an uninterrupted run leaves them."""

    def __init__(self, loader):
        self._loader = loader
        self._index_sampler = ()
        self.generator = torch.Generator()

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _Recording(_dataloader._BaseDataLoaderIter):
    """Placed between a torch iterator class and ``_BaseDataLoaderIter``:
    each epoch's sampler iterator is a ``_Recorder`` (in ``_autosafe_watch``);
    given ``_autosafe_resume``, the iterator starts with its base seed and
    the indices drawn so far, then draws on."""

    _autosafe_resume = None

    def __init__(self, loader):
        resume = self._autosafe_resume
        if resume is None:
            super().__init__(loader)
            return
        super().__init__(_LoaderView(loader))
        self._index_sampler = loader._index_sampler
        self._base_seed = resume.base_seed

    def _reset(self, loader, first_iter=False):
        resume, watch = self._autosafe_resume, self._autosafe_watch
        if resume is None:
            super()._reset(loader, first_iter)
            self._sampler_iter = watch.recorder = _Recorder(self._sampler_iter)
            return
        self._autosafe_resume = None
        watch.recorder = resume.recorder
        self._sampler_iter = resume.recorder.again()
        self._num_yielded = 0
        self._IterableDataset_len_called = loader._IterableDataset_len_called


class _WatchedWorkers(_MP_ITER, _Recording):
    """torch's iterator, with the sampler's indices recorded, deaths left to
    us (out of torch's SIGCHLD table) and a watchdog on every wait."""

    # Until torch's __init__ sets it, no worker has started: an iterator that
    # could not start (no file descriptor for its queues) has nothing to stop.
    _shutdown = True

    def __init__(self, loader, watch, resume=None):
        self._autosafe_watch = watch
        self._autosafe_resume = resume
        watch.fresh = True
        super().__init__(loader)

    def _reset(self, loader, first_iter=False):
        if first_iter and self._worker_pids_set:
            signal_handling._remove_worker_pids(id(self))
            self._worker_pids_set = False
        super()._reset(loader, first_iter)

    def _process_data(self, data, worker_idx):
        self._autosafe_watch.delivered_by(worker_idx)
        return super()._process_data(data, worker_idx)

    def _shutdown_workers(self):
        try:
            super()._shutdown_workers()
        finally:
            watch = self._autosafe_watch
            if watch.pending and watch.delivered:
                # Dropped before every worker delivered (a program that takes one
                # batch): the workers that did show the remedies held.
                watch.held()
            outcome = watch.outcome
            if outcome is not None:
                engine.decide_or(None, "DataLoader worker reports", outcome.workers_exited,
                                 getattr(self, "_workers", ()))

    def _get_data(self):
        watch = self._autosafe_watch
        limit = watch.limit()
        start = time.monotonic()
        while True:
            try:
                success, data = self._try_get_data(POLL_S)
            except Exception as exc:
                failure = _observe(self, exc)
                if failure is None:
                    raise
                raise _Failed(failure) from None
            if success:
                watch.observed(time.monotonic() - start)
                return data
            if self._pin_memory and not self._pin_memory_thread.is_alive():
                raise RuntimeError("Pin memory thread exited unexpectedly")
            waited = time.monotonic() - start
            if self._timeout > 0 and waited >= self._timeout:
                # The user's own limit: torch's error, as torch raises it; no recovery.
                raise RuntimeError("DataLoader timed out after %s seconds" % self._timeout)
            if limit is not None and waited >= limit:
                info = self._task_info.get(self._rcvd_idx) or (None,)
                worker = info[0]
                pid = self._workers[worker].pid if worker is not None else None
                raise _Failed(F.Failure(F.HUNG, worker=worker, pid=pid, waited=waited))


def collate_in_process(batch):
    """torch's ``default_collate`` without its shared-memory output: in a
    worker it writes the batch straight into /dev/shm for the main process,
    but an emulated worker is in the main process (and /dev/shm may be what
    failed). The same values; ``get_worker_info()`` is None for its length only."""
    saved = _worker_module._worker_info
    _worker_module._worker_info = None
    try:
        return default_collate(batch)
    finally:
        _worker_module._worker_info = saved


class _Emulated(EmulatedWorkersIter):
    """The last rung: emulated workers (exact), collating as in process."""

    def __init__(self, loader):
        super().__init__(loader)
        for worker in self._workers:
            if worker.collate_fn is default_collate:
                worker.collate_fn = collate_in_process
                if worker.fetcher is not None:
                    worker.fetcher.collate_fn = collate_in_process


class _ResumedEmulation(_Emulated, _Recording):
    def __init__(self, loader, watch, resume):
        self._autosafe_watch = watch
        self._autosafe_resume = resume
        super().__init__(loader)


def _dead_workers(inner):
    return [(i, w) for i, w in enumerate(inner._workers)
            if w.exitcode is not None and (w.exitcode != 0 or inner._workers_status[i])]


def _observe(inner, exc):
    """The ``Failure`` behind ``exc``, raised while a batch was awaited, or None:
    not a failure of the workers (torch's error stands)."""
    kind = F.exception_kind(exc)
    dead = _dead_workers(inner)
    deadline = time.monotonic() + DEATH_WAIT_S
    while not dead and kind is None and F.lost_peer(exc) and time.monotonic() < deadline:
        time.sleep(0.02)
        dead = _dead_workers(inner)
    if dead:
        worker, process = dead[0]
        return F.Failure(kind or F.death_kind(process.exitcode), exc, worker, process.pid,
                         F.exit_status(process.exitcode))
    return F.Failure(kind, exc) if kind else None


_WORKER_WORDS = re.compile(r"in DataLoader worker process (\d+)")


def _raised_in_worker(inner, exc):
    """A shared-memory or open-file failure a worker reported as its batch's
    error (torch re-raises it here), as a ``Failure``; None: the user's error."""
    kind = F.exception_kind(exc)
    if kind is None or not isinstance(inner, _WatchedWorkers):
        return None
    found = _WORKER_WORDS.search(F.exception_text(exc))
    worker = int(found.group(1)) if found else None
    pid = inner._workers[worker].pid if worker is not None and worker < len(inner._workers) \
        else None
    failure = F.Failure(kind, exc, worker, pid)
    if kind == F.CUDA:  # the worker's own traceback, as torch passed it on: the user's line
        failure.dump = F.exception_text(exc)
    return failure


def _replay(inner, count):
    """Fetch again, and drop, the ``count`` batches already delivered, so
    that every worker's state is where the failure found it."""
    for _ in range(count):
        try:
            inner._next_data()
        except _Failed:
            raise
        except Exception as exc:  # the user's own error, delivered once already
            failure = _raised_in_worker(inner, exc)
            if failure is not None:
                raise _Failed(failure) from None
    inner._num_yielded = count


# -- the rungs -----------------------------------------------------------------


class _Ladder:
    """Per loader: how often each rung failed, the settings real workers now
    start with, and whether the loader has gone to emulated workers."""

    __slots__ = ("failures", "settings", "emulated")

    def __init__(self):
        self.failures = {}
        self.settings = set()
        self.emulated = False


_LADDER_ATTR = "_autosafe_torch_recovery"


def _ladder(loader):
    ladder = loader.__dict__.get(_LADDER_ATTR)
    if ladder is None:
        ladder = loader.__dict__[_LADDER_ATTR] = _Ladder()
    return ladder


def _real_workers(loader, ladder, watch, resume=None):
    """A watched torch iterator with the ladder's settings, each worker's own
    file descriptions (first of all) and the diagnostics step in its workers;
    the loader's own attributes are left as they were."""
    watch.dumps = dump_dir()
    init = with_step(loader.worker_init_fn,
                     functools.partial(faulthandler_in_worker, watch.dumps))
    table = own_files(loader, watch.dumps)
    if table is not None:
        init = with_step(init, isolation.worker_step(table), first=True)
        if watch.outcome is not None:
            watch.outcome.table = table
    if ladder_rules.FILE_SYSTEM in ladder.settings:
        file_system_sharing(None)
        init = with_step(init, use_file_system_sharing)
    saved = loader.worker_init_fn, loader.prefetch_factor
    loader.worker_init_fn = init
    if ladder_rules.FEWER in ladder.settings:
        loader.prefetch_factor = 1
    try:
        return _WatchedWorkers(loader, watch, resume)
    finally:
        loader.worker_init_fn, loader.prefetch_factor = saved


def own_files(loader, report_dir):
    """The ``DescriptorTable`` that gives each worker of ``loader`` its own
    description of every file this process reads (DL207; carried to spawned
    workers: DL217), or None (both off, or nothing to give: no file open,
    no native handle)."""
    from ..rules import RULES

    forked, carry = (CONFIG.mode == "fix" and engine.enabled(RULES[code])
                     for code in ("DL207", "DL217"))
    if not (forked or carry):
        return None
    handles = ()
    if forked and _loader_state(loader, "fork_handles"):
        handles, _unhandled = isolation.native_handles(isolation.parts_of(
            {name: getattr(loader, name) for name in isolation.PARTS}))
        handles = [(held, args) for held, args, _note in handles]
    table = isolation.DescriptorTable.take(handles, report_dir, forked, carry)
    if carry and table.files:
        table.by_number = isolation.held_numbers(
            {name: getattr(loader, name) for name in isolation.PARTS},
            [f.fd for f in table.files])
    return table if table else None


def _replanned_without_fork(loader, failure, watch):
    """Whether ``loader``, whose forked workers failed with ``failure`` (one
    touched CUDA), now starts its workers by spawn, planned again with fork
    ruled out and its repairs applied; their records wait for the new workers,
    as those of an iteration do. False: only emulated workers reach it."""
    from .dataloader import plan_without_fork

    made = plan_without_fork(loader, failure, sys._getframe())
    if made is None:
        return False
    watch.pending.extend(made)
    watch.delivered = set()
    return True


def _loader_state(loader, name):
    from .dataloader import loader_state

    return loader_state(loader, name)


def _stop(inner):
    """Kill a failed iterator's workers (a hung one would not exit), then let
    torch clean up its queues."""
    for process in getattr(inner, "_workers", ()):
        if isinstance(process, multiprocessing.process.BaseProcess) and process.is_alive():
            process.kill()
    try:
        inner._shutdown_workers()
    except Exception:
        pass


# -- the recovering iterator -----------------------------------------------------


class RecoveringIter(wrapt.ObjectProxy):
    """What the loader's ``_get_iterator`` returns while its workers are
    watched. A proxy, so that DataLoader's persistent ``_reset`` and
    everything else reach the inner iterator, whichever it is now."""

    def __init__(self, inner, loader, ladder, watch):
        super().__init__(inner)
        # A persistent loader holds its iterator: no cycle through us.
        self._self_loader = weakref.ref(loader) if loader.persistent_workers \
            else (lambda: loader)
        self._self_ladder = ladder
        self._self_watch = watch
        self._self_rung = ladder_rules.AS_ASKED
        self._self_delivered = 0
        self._self_epoch = 0
        self._self_pending = None

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            try:
                data = next(self.__wrapped__)
            except _Failed as failed:
                failure = failed.failure
            except StopIteration:
                self._settle()
                raise
            except Exception as exc:
                failure = _raised_in_worker(self.__wrapped__, exc)
                if failure is None or failure.kind not in self._self_watch.kinds:
                    self._self_delivered += 1  # the error stands for its batch, as in torch
                    self._settle()
                    raise
            else:
                self._self_delivered += 1
                if self._self_pending is not None \
                        and self._self_delivered >= self._self_pending[-1]:
                    self._settle()
                return data
            self._recover_or_raise(failure)

    def _reset(self, loader, first_iter=False):
        """A persistent loader's next epoch."""
        self._settle()
        self._self_delivered = 0
        self._self_epoch += 1
        try:
            return self.__wrapped__._reset(loader, first_iter)
        except _Failed as failed:
            failure = failed.failure
        self._recover_or_raise(failure)
        return None

    def _recover_or_raise(self, failure):
        try:
            recovered = self._recover(failure)
        except NoExactRung:
            raise
        except Exception as exc:  # ours: the user gets torch's error
            from ..report import internal_error

            internal_error("DataLoader recovery", exc)
            recovered = False
        if not recovered:
            raise failure.error()

    def _recover(self, failure):
        """Rebuild on the next rung until one resumes; False when none is left
        (or the failure's kind is not watched)."""
        loader = self._self_loader()
        ladder, watch = self._self_ladder, self._self_watch
        if failure.kind not in watch.kinds:
            return False  # its rule is disabled: torch's error, the workers untouched
        failure.batch = self._self_delivered
        rung = self._self_rung
        if self._self_pending is None:
            first, first_rung, tried, verify_at = failure, rung, [], 0
        else:  # the last recovery's rung failed before it was verified: one story
            first, first_rung, tried, _rung, _exact, verify_at = self._self_pending
            self._self_pending = None
        current = failure
        while True:
            # Verified once every batch in flight at the failure is delivered.
            verify_at = max(verify_at, getattr(self.__wrapped__, "_send_idx", 0))
            self._diagnose(current)
            if current is failure:
                watch.did_not_hold(failure)  # now that it is known whether it died starting
            _stop(self.__wrapped__)
            counted = ladder_rules.RESTART if rung == ladder_rules.AS_ASKED else rung
            ladder.failures[counted] = ladder.failures.get(counted, 0) + 1
            if current.starting:  # new workers would get the same pickle, and fail alike
                ladder.failures[ladder_rules.RESTART] = ladder_rules.MAX_FAILURES
            if current is not first:
                tried.append((rung, current))
            if current.kind not in watch.kinds or loader is None:
                return False
            rung = ladder_rules.next_rung(current.kind, ladder.failures)
            if rung == ladder_rules.SPAWN and not _replanned_without_fork(loader, current,
                                                                          watch):
                rung = ladder_rules.EMULATED  # it does not reach spawn workers
            if rung is None or rung == ladder_rules.EMULATED and _lacks(
                    "emulated", torch_seams.emulated_missing(), "workers are not emulated"):
                return False
            try:
                self._rebuild(loader, rung)
            except NoExactRung:
                raise  # no rung gives the batches exactly: said, and not run otherwise
            except _Failed as failed:
                current = failed.failure
                current.batch = self._self_delivered
                continue
            except Exception as exc:  # it could not start: that rung failed
                current = F.Failure(F.exception_kind(exc) or current.kind, exc)
                current.batch = self._self_delivered
                continue
            self._self_rung = rung
            exact = None
            if loader.persistent_workers and self._self_epoch:
                exact = ("a persistent loader after its first epoch: the new workers start "
                         "from their seeds, not from the states earlier epochs left")
            self._self_pending = (first, first_rung, tried, rung, exact, verify_at)
            return True

    def _rebuild(self, loader, rung):
        ladder, watch = self._self_ladder, self._self_watch
        resume = _Resume(self.__wrapped__._base_seed, watch.recorder)
        if rung == ladder_rules.EMULATED:
            ladder.emulated = True
            inner = _ResumedEmulation(loader, watch, resume)
        else:
            if rung in ladder_rules.SETTINGS:
                ladder.settings.add(rung)
            inner = _real_workers(loader, ladder, watch, resume)
            if loader.pin_memory:
                from . import pinning

                pinning.serves(inner, callsite.iteration_site(loader))
        self.__wrapped__ = inner
        _replay(inner, self._self_delivered)

    def _diagnose(self, failure):
        """The worker's traceback (a crash) or every worker's stacks (a hang)."""
        try:
            inner, directory = self.__wrapped__, self._self_watch.dumps
            processes = [p for p in getattr(inner, "_workers", ())
                         if isinstance(p, multiprocessing.process.BaseProcess)]
            if directory is None or not processes:
                return
            if failure.kind == F.HUNG:
                for process in processes:
                    if process.is_alive():
                        os.kill(process.pid, DUMP_SIGNAL)
                deadline = time.monotonic() + DUMP_WAIT_S
                paths = [dump_path(directory, i, p.pid) for i, p in enumerate(processes)]
                while time.monotonic() < deadline and not all(_read(p) for p in paths):
                    time.sleep(0.02)
                failure.dump = "\n".join("worker %d (pid %d):\n%s" % (
                    i, p.pid, _read(path).rstrip() or "(no stack written)")
                    for i, (p, path) in enumerate(zip(processes, paths)))
            elif failure.worker is not None and failure.pid is not None and not failure.dump:
                own = dump_path(directory, failure.worker, failure.pid)
                failure.dump = _read(own).rstrip()
                if not failure.dump:  # died while starting, before its steps ran?
                    failure.dump = _read(bootstrap_path(directory, failure.pid)).rstrip()
                    # Its first step makes its dump file: none, and it never ran it.
                    failure.starting = bool(failure.dump) or not os.path.exists(own)
                if not failure.dump and failure.status and not failure.starting:
                    exitcode = processes[failure.worker].exitcode
                    failure.note = F.why_no_traceback(exitcode)
            failure.dump = F.trim_dump(failure.dump) if failure.dump else ""
        except Exception:
            pass

    def _settle(self):
        """Record a recovery once its rung has delivered every batch that was in
        flight at the failure (verified, not predicted), or the epoch ended; and
        the records waiting on the workers, for the batches they delivered."""
        self._self_watch.held()
        pending, self._self_pending = self._self_pending, None
        if pending is not None:
            engine.decide_or(None, "DataLoader recovery log", _record, pending)


def _record(pending):
    from ..callsite import user_call_site
    from ..rules import Context

    first, first_rung, tried, rung, exact, _verify_at = pending
    ctx = Context(None, failure=first, first_rung=first_rung, tried=tried, rung=rung,
                  exact=exact)
    found, _ = engine.run_checks("dataloader.failure", {}, ctx)
    if found:
        engine.settle(found, user_call_site())


# -- the entry point --------------------------------------------------------------


def watched(loader, wrapped, args, kwargs, pending=()):
    """``wrapped(*args, **kwargs)`` (``DataLoader._get_iterator``), watched and
    recovered where that is exact; unchanged otherwise, or on an error of ours.
    ``pending``: the records of this iteration's worker checks, made once the
    workers showed that their remedies held."""
    start = engine.decide_or(None, "DataLoader recovery", _plan, loader, wrapped)
    if start is None:
        return _unwatched(loader, wrapped, args, kwargs, pending)
    return start(pending)


def _unwatched(loader, wrapped, args, kwargs, pending):
    """torch's own iterator, each worker's own files first where there are
    workers; the records are made once the workers started (not watched:
    nothing more is seen of them)."""
    table = engine.decide_or(None, "DataLoader worker isolation", own_files, loader,
                             dump_dir()) if loader.num_workers else None
    mark = _warm_mark(pending)
    if table is None:
        iterator = wrapped(*args, **kwargs)
    else:
        saved = loader.worker_init_fn
        loader.worker_init_fn = with_step(saved, isolation.worker_step(table), first=True)
        try:
            iterator = wrapped(*args, **kwargs)
        finally:
            loader.worker_init_fn = saved
    engine.decide_or(None, "DataLoader records", _warm_outcome, pending, mark)
    record_held(pending)
    return iterator


def emulated(loader, pending=(), torch_s=None):
    """The emulated-workers rung a rule chose for ``loader``; its records once
    every worker has its copy (or, where none can be made, as what happened).
    ``torch_s()`` makes torch's own iterator, for a torch whose private names
    the emulated workers need have moved: the records then say it did not hold."""
    if torch_s is not None and _lacks("emulated", torch_seams.emulated_missing(),
                                      "workers are not emulated"):
        engine.decide_or(None, "DataLoader records", _record_refused, pending,
                         NoExactRung("this torch lacks what emulated workers need"))
        return torch_s()
    try:
        iterator = _Emulated(loader)
    except NoExactRung as refused:
        engine.decide_or(None, "DataLoader records", _record_refused, pending, refused)
        not_rebuilt = _loader_state(loader, "not_rebuilt")
        if not_rebuilt:  # the rung above was refused too: why
            raise NoExactRung("%s\n  %s" % (refused.reason, not_rebuilt), refused.fix) \
                from None
        raise
    record_held(pending)
    return iterator


def _record_refused(pending, refused):
    for intervention in pending:
        engine.record_outcome(intervention, failed=refused.reason)


def _plan(loader, wrapped):
    """A callable that starts the watched iterator, or None: leave it to torch."""
    if CONFIG.mode != "fix" or not loader.num_workers or not getattr(loader, "in_order", True):
        return None
    original = getattr(_dataloader.DataLoader.__dict__.get("_get_iterator"), "__wrapped__", None)
    if getattr(wrapped, "__func__", None) is not original \
            or _dataloader._MultiProcessingDataLoaderIter is not _MP_ITER:
        return None  # someone else's iterator: not ours to rebuild
    if isinstance(loader.dataset, (_dataloader.IterDataPipe, _dataloader.MapDataPipe)):
        return None
    kinds = ladder_rules.kinds_watched(engine.enabled)
    if not kinds:
        return None
    if _lacks("watched", torch_seams.watched_missing(), "workers not watched"):
        return None
    return functools.partial(_start, loader, kinds)


_said = set()


def _lacks(seam, missing, consequence):
    """Whether this torch lacks what ``seam`` needs; said once per process."""
    if missing and seam not in _said:
        _said.add(seam)
        from ..report import log, shorten_line

        log(logging.WARNING, "torch %s lacks %s: %s; torch's own iterator runs instead",
            torch.__version__, shorten_line(missing, 80), consequence)
    return bool(missing)


def _start(loader, kinds, pending):
    ladder = _ladder(loader)
    if ladder.emulated:  # this loader's workers failed on every real rung
        return emulated(loader, pending)
    callsite.as_if_called_from(  # its warning names torch's line, as without the shim
        getattr(_dataloader.DataLoader.__dict__.get("_get_iterator"), "__wrapped__", None),
        loader.check_worker_number_rationality)
    site = callsite.iteration_site(loader)
    named = any(i.code == "DL207" for i in pending)
    outcome = isolation.Outcome(None, functools.partial(_say_used, site, named,
                                                        loader.num_workers))
    watch = _Watch(kinds, CONFIG.hang_timeout, loader.timeout, pending, loader.num_workers,
                   outcome)
    mark = _warm_mark(pending)
    inner = _real_workers(loader, ladder, watch)
    engine.decide_or(None, "DataLoader records", _warm_outcome, pending, mark)
    return RecoveringIter(inner, loader, ladder, watch)


def _warm_mark(pending):
    """Where the warm starts stood before this iterator's workers (DL209), or None."""
    if not any(i.code == "DL209" for i in pending):
        return None
    from ..remedies import warmstart

    return warmstart.starts().mark()


def _warm_outcome(pending, mark):
    """DL209's record says how the workers came once they started: from the
    warm server, or, where some came by plain spawn, that it did not hold
    and why (its own line, with the user's file:line)."""
    if mark is None:
        return
    from ..rules import number_of
    from ..remedies import warmstart

    started = warmstart.starts()
    _warm, plain = started.since(mark)
    for warm in [i for i in pending if i.code == "DL209" and i.strategy == "warm forkserver"]:
        if not plain:
            continue
        for host in pending:
            if warm in host.clauses:
                host.clauses.remove(warm)
        warm.failed("%s started by plain spawn: %s" % (
            number_of(plain, "worker"), started.reason or "the warm server did not start"))


def _say_used(site, named, workers, usage):
    """The records of what the workers read through descriptions of their own
    that no object named (DL207 said the named ones)."""
    from ..rules import Context

    if usage.missing:
        from ..report import log

        log(logging.DEBUG, "%s: not reached in the workers (the number holds another file "
            "there): %s", site, "; ".join("%s: %s" % item for item in usage.missing.items()))
    found = engine.run_checks("dataloader.outcome", {},
                              Context(None, usage=usage, workers=workers, named=named))[0]
    if found:
        engine.settle(found, site)
