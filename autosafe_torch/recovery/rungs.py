"""Building a loader's iterator on a rung of the ladder (``rules/ladder.py``):
real workers are torch's iterator, watched (``torch_private.Watched``);
emulated workers are ``remedies/emulated_workers.py``. Either may resume an
earlier iterator (``replay``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing.process
from typing import Any

import torch

from .. import engine, facts
from .. import torch_private as tp
from ..config import CONFIG
from ..loaderstate import state_of
from ..inspection.diagnostics import dump_dir, faulthandler_in_worker, telling_workers
from ..inspection.parts import parts_of
from ..remedies import isolation, loggers, pickling, process_state, sent_once
from ..remedies.emulated_workers import EmulatedWorkersIter
from ..remedies.limits import file_system_sharing
from ..remedies.workerinit import with_step
from ..report import log, shorten_line
from ..rules.fork import own_descriptions_wanted
from ..rung import Rung
from .watch import POLL_S, Failed, raised_in_worker


class LoaderLadder:
    """Per loader: each rung's failures, the settings real workers now start
    with, the rung its workers went to after they failed (None: as planned)."""

    __slots__ = ("failures", "settings", "rung")

    def __init__(self):
        self.failures = {}
        self.settings = set()
        self.rung = None


def ladder_of(loader):
    state = state_of(loader)
    if state.ladder is None:
        state.ladder = LoaderLadder()
    return state.ladder


# -- real workers ---------------------------------------------------------------------

def real_workers(loader, ladder, watch, resume=None):
    """A watched torch iterator with the ladder's settings, each worker's own
    file descriptions (first of all) and the diagnostics step (NOTE [the data
    flow of a repaired loader], step 1)."""
    init = with_step(loader.worker_init_fn, functools.partial(faulthandler_in_worker, dump_dir()))
    table = own_files(loader)
    if table is not None:
        init = with_step(init, isolation.worker_step(table), first=True)
        if watch.outcome is not None:
            watch.outcome.table = table
    if Rung.FILE_SYSTEM in ladder.settings:
        file_system_sharing(None)
        init = with_step(init, file_system_sharing)
    fewer = 1 if Rung.FEWER in ladder.settings else None
    with sending_to_workers(loader, init, fewer):
        return tp.Watched(loader, watch, resume, poll_s=POLL_S)


@contextlib.contextmanager
def sending_to_workers(loader, init=None, prefetch_factor=None):
    """While ``loader``'s workers start, with ``init`` and ``prefetch_factor``
    where given: what they are told and sent besides the loader."""
    state = state_of(loader)
    spawned = CONFIG.mode == "fix" and \
        facts.effective_start_method(loader.multiprocessing_context) != "fork"
    with contextlib.ExitStack() as sending:
        sending.callback(setattr, loader, "worker_init_fn", loader.worker_init_fn)
        if init is not None:
            loader.worker_init_fn = init
        if prefetch_factor is not None:
            sending.callback(setattr, loader, "prefetch_factor", loader.prefetch_factor)
            loader.prefetch_factor = prefetch_factor
        sending.enter_context(telling_workers(dump_dir()))  # where a failed start's traceback goes
        if state.kept.loggers is not None:
            sending.enter_context(loggers.carrying(state.kept.loggers))  # DL219
        carry = state.kept.process_state
        if carry is not None and spawned:  # DL220: ahead of the dataset; a worker without it stops
            loader.worker_init_fn = with_step(loader.worker_init_fn,
                                              process_state.refuse_in_worker)
            if not torch_lacks("process state"):
                first = functools.partial(process_state.StateFirst,
                                          carried=carry.start(dump_dir()))
                sending.enter_context(tp.dataset_kind_as(loader, first))
        if spawned and state.untouched:  # nothing of ours in the dataset: pickled once for all
            sending.enter_context(sent_once.offering(loader))
        sending.enter_context(pickled_for_workers(loader))
        yield


def pickled_for_workers(loader):
    """The workers' sending pickled by our ``WorkerPickler``, where a repair of
    ours acts and they do not fork."""
    context = loader.multiprocessing_context
    method = facts.effective_start_method(context)
    if not pickling.WorkerPickler.acts() or method == "fork":
        return contextlib.nullcontext()
    sent = pickling.WorkerContext(torch.multiprocessing if context is None else context, method)
    return tp.multiprocessing_context_as(loader, sent)


def own_files(loader):
    """The ``DescriptorTable`` that gives each worker of ``loader`` its own
    description of every file this process reads (DL207; carried to spawned
    workers: DL217), or None (both off, or nothing to give)."""
    if CONFIG.mode != "fix":
        return None
    forked, carry = own_descriptions_wanted(engine.enabled)
    if not (forked or carry):
        return None
    handles: list[tuple[Any, Any]] = []
    if forked and state_of(loader).kept.fork_handles:
        native, _unhandled = isolation.native_handles(isolation.users_parts(loader))
        handles = [(held, args) for held, args, _note in native]
    table = isolation.DescriptorTable.take(handles, dump_dir(), forked, carry)
    if carry and table.files:
        table.by_number = isolation.held_numbers(parts_of(loader), [f.fd for f in table.files])
    return table if table else None


def stop(inner):
    """Kill a failed iterator's workers (a hung one would not exit), then torch's cleanup."""
    for process in tp.worker_processes(inner):
        if isinstance(process, multiprocessing.process.BaseProcess) and process.is_alive():
            process.kill()
    with contextlib.suppress(Exception):
        tp.shut_down(inner)


# -- emulated workers ------------------------------------------------------------------

class Emulated(EmulatedWorkersIter):
    """The last rung: emulated workers (exact), collating as in process."""

    def __init__(self, loader):
        super().__init__(loader)
        for worker in self.workers:
            if worker.collate_fn is tp.default_collate:
                worker.collate_fn = tp.collate_in_process
                if worker.fetcher is not None:
                    worker.fetcher.collate_fn = tp.collate_in_process


class ResumedEmulation(Emulated, tp.Recording):
    def __init__(self, loader, watch, resume):
        self._autosafe_watch = watch
        self._autosafe_resume = resume
        super().__init__(loader)


# -- resuming ---------------------------------------------------------------------------

def replay(inner, count):
    """Fetch again, and drop, the ``count`` batches already delivered: every
    worker's state is then where the failure found it."""
    for _ in range(count):
        try:
            tp.fetch_next(inner)
        except Failed:
            raise
        except Exception as exc:  # the user's own error, delivered once already
            failure = raised_in_worker(inner, exc)
            if failure is not None:
                raise Failed(failure) from None
    tp.set_yielded(inner, count)


# Each seam: what this torch lacks for it (``torch_private``), and what follows.
_SEAMS = {"watched": (tp.watched_missing, "workers not watched"),
          "emulated": (tp.emulated_missing, "workers are not emulated"),
          "process state": (tp.dataset_kind_missing,
                            "what main() set does not reach spawned workers")}


@functools.cache
def torch_lacks(seam):
    """Whether this torch lacks what ``seam`` needs; said once per process."""
    find, consequence = _SEAMS[seam]
    missing = find()
    if missing:
        log(logging.WARNING, "torch %s lacks %s: %s; torch's own iterator runs instead",
            torch.__version__, shorten_line(missing, 80), consequence)
    return bool(missing)
