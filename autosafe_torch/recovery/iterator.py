"""The recovering iterator: on a ``Failed`` (``watch.py``) or a worker's error
of a watched kind, read what the workers left (``_diagnose``), stop them,
build the ladder's next rung (``rungs.py``) and replay the batches delivered;
once the rung delivered every batch in flight at the failure, the recovery's
record is made (``dataloader.failure``)."""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import sys
import time
import weakref

import wrapt

from .. import callsite, engine
from .. import torch_private as tp
from ..engine import loader as plans
from ..errors import NoExactRung
from ..inspection import failures as F
from ..inspection.diagnostics import DUMP_SIGNAL, bootstrap_path, dump_dir, dump_path
from ..inspection.diagnostics import read as read_dump
from ..remedies import process_state
from ..rules import FailureContext
from ..rules import ladder as L
from ..rung import Rung
from .rungs import ResumedEmulation, real_workers, replay, stop, torch_lacks
from .watch import Failed, Watch, raised_in_worker

DUMP_WAIT_S = 1.0     # for the hung workers' stacks to be written


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
        self._self_rung = Rung.AS_ASKED
        self._self_delivered = 0
        self._self_epoch = 0
        # A recovery's record (its context at dataloader.failure), and the batches delivered
        # that verify it (``_settle``).
        self._self_pending: tuple[FailureContext, int] | None = None

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            try:
                data = next(self.__wrapped__)
            except Failed as failed:
                failure = failed.failure
            except StopIteration:
                self._settle()
                raise
            except Exception as exc:
                failure = raised_in_worker(self.__wrapped__, exc)
                if failure is None or failure.kind not in self._self_watch.kinds:
                    self._self_delivered += 1  # the error stands for its batch, as in torch
                    self._settle()
                    raise
            else:
                self._self_delivered += 1
                if self._self_pending is not None \
                        and self._self_delivered >= self._self_pending[1]:
                    self._settle()
                return data
            self._recover_or_raise(failure)

    def _reset(self, loader, first_iter=False):
        """A persistent loader's next epoch."""
        self._settle()
        self._self_delivered = 0
        self._self_epoch += 1
        try:
            return tp.next_epoch(self.__wrapped__, loader, first_iter)
        except Failed as failed:
            failure = failed.failure
        self._recover_or_raise(failure)
        return None

    def _recover_or_raise(self, failure):
        if not engine.fail_open(False, "DataLoader recovery", self._recover, failure):
            raise failure.error()  # on an error of ours too: torch's

    def _recover(self, failure):
        """Rebuild on the next rung until one resumes; False: none left, or not watched."""
        loader = self._self_loader()
        ladder, watch = self._self_ladder, self._self_watch
        if failure.kind not in watch.kinds:
            return False  # its rule is disabled: torch's error, the workers untouched
        failure.batch = self._self_delivered
        rung: Rung | None  # None: the ladder has no rung left
        rung = self._self_rung
        # One story where the last recovery's rung failed before it was verified.
        story, verify_at = self._self_pending or (
            FailureContext(None, failure=failure, first_rung=rung, rung=rung), 0)
        self._self_pending = None
        current = failure
        while True:
            # Verified once every batch in flight at the failure is delivered.
            verify_at = max(verify_at, tp.batches_sent(self.__wrapped__))
            self._diagnose(current)
            # Now that it is known whether it died starting: the records waiting on
            # these workers (the iteration's, or a replanned rung's) did not hold.
            watch.did_not_hold(current)
            stop(self.__wrapped__)
            counted = Rung.RESTART if rung == Rung.AS_ASKED else rung
            ladder.failures[counted] = ladder.failures.get(counted, 0) + 1
            if current.starting:  # new workers would get the same pickle, and fail alike
                ladder.failures[Rung.RESTART] = L.MAX_FAILURES
            if current is not story.failure:
                story.tried = [*story.tried, (rung, current)]
            if current.kind not in watch.kinds or loader is None:
                return False
            rung = L.next_rung(current.kind, ladder.failures)
            if rung == Rung.SPAWN_WORKERS:  # forked ones touched CUDA: plan again without fork
                made = plans.plan_without_fork(loader, current, sys._getframe())
                if made is None:
                    rung = Rung.EMULATED  # only emulated workers reach it
                else:  # their records wait for the new workers
                    watch.pending.extend(made)
                    watch.delivered = set()
            if rung is None or rung == Rung.EMULATED and torch_lacks("emulated"):
                return False
            try:
                self._rebuild(loader, rung)
            except NoExactRung as refused:  # said, and not run otherwise: with why the
                raise NoExactRung("%s\n  and the rung before it failed: %s" % (  # rung above
                    refused.reason, current.what(room=160)), refused.fix) from None
            except Exception as exc:  # a Failed, or it could not start: that rung failed
                current = exc.failure if isinstance(exc, Failed) else F.Failure(
                    F.exception_kind(exc) or current.kind, exc)
                current.batch = self._self_delivered
                continue
            self._self_rung = rung
            story.rung, story.exact = rung, None
            if loader.persistent_workers and self._self_epoch:
                story.exact = ("a persistent loader after its first epoch: the new workers "
                               "start from their seeds, not from the states earlier epochs left")
            self._self_pending = story, verify_at
            return True

    def _rebuild(self, loader, rung):
        ladder, watch = self._self_ladder, self._self_watch
        resume = tp.Resume(tp.base_seed(self.__wrapped__), watch.recorder)
        ladder.rung = rung
        if rung == Rung.EMULATED:
            inner = ResumedEmulation(loader, watch, resume)
        else:
            if rung in L.SETTINGS:
                ladder.settings.add(rung)
            inner = real_workers(loader, ladder, watch, resume)
            if loader.pin_memory:
                callsite.pin_thread_serves(inner, callsite.iteration_site(loader))
        self.__wrapped__ = inner
        replay(inner, self._self_delivered)

    def _diagnose(self, failure):
        """The worker's traceback (a crash) or every worker's stacks (a hang)."""
        with contextlib.suppress(Exception):
            inner, directory = self.__wrapped__, dump_dir()
            processes = [p for p in tp.worker_processes(inner)
                         if isinstance(p, multiprocessing.process.BaseProcess)]
            if not processes:
                return
            if failure.kind == F.HUNG:
                for process in processes:
                    if process.is_alive() and process.pid is not None:
                        os.kill(process.pid, DUMP_SIGNAL)
                deadline = time.monotonic() + DUMP_WAIT_S
                paths = [dump_path(directory, i, p.pid) for i, p in enumerate(processes)]
                while time.monotonic() < deadline and not all(read_dump(p) for p in paths):
                    time.sleep(0.02)
                failure.dump = "\n".join("worker %d (pid %s):\n%s" % (
                    i, p.pid, read_dump(path).rstrip() or "(no stack written)")
                    for i, (p, path) in enumerate(zip(processes, paths)))
            elif failure.worker is not None and failure.pid is not None and not failure.dump:
                own = dump_path(directory, failure.worker, failure.pid)
                failure.dump = read_dump(own).rstrip()
                if not failure.dump:  # died while starting, before its steps ran?
                    failure.dump = read_dump(bootstrap_path(directory, failure.pid)).rstrip()
                    # Its first step makes its dump file: none, and it never ran it.
                    failure.starting = bool(failure.dump) or not os.path.exists(own)
                if not failure.dump and failure.status and not failure.starting:
                    failure.note = F.why_no_traceback(processes[failure.worker].exitcode)
            failure.dump = F.trim_dump(failure.dump) if failure.dump else ""

    def _settle(self):
        """Record a recovery once its rung delivered every batch in flight at the
        failure (verified, not predicted), or the epoch ended; and the records
        waiting on the workers."""
        self._self_watch.held()
        pending, self._self_pending = self._self_pending, None
        if pending is not None:
            engine.fail_open(None, "DataLoader recovery log", _record, pending[0])


def _record(ctx: FailureContext) -> None:
    found, _ = engine.run_checks("dataloader.failure", {}, ctx)
    if found:
        engine.settle(found, callsite.user_call_site())


class UnwatchedIter(wrapt.ObjectProxy):
    """torch's own iterator, its workers not watched (``unwatched``: why) but
    repaired: the records (``pending``) hold, as a ``Watch`` holds them, once
    each of the first ``workers`` batches came (torch sends the first indices
    round robin and delivers in order: batch i is worker i's), or the
    iterator ends, raises a worker's own error or is dropped after a
    delivery; a death before any says nothing. A repair a worker could not
    apply (``RemedyFailed``) cannot step down (no rung resumes without the
    watch's record of the indices drawn): its records say it failed, and the
    run stops with ``NoExactRung``, never after "fixed"."""

    def __init__(self, inner, pending, workers, unwatched):
        super().__init__(inner)
        self._self_watch = Watch(frozenset(), 0, 0, pending, workers)
        self._self_unwatched = unwatched

    def __iter__(self):
        return self

    def __next__(self):
        watch = self._self_watch
        try:
            data = next(self.__wrapped__)
        except StopIteration:
            watch.held()
            raise
        except Exception as exc:
            if F.exception_kind(exc) == F.REMEDY:
                self._refuse(exc)
            if watch.delivered or tp.worker_named_in(F.exception_text(exc)) is not None:
                watch.held()  # a worker's own error: it ran with the repairs
            raise  # the error stands for its batch, as in torch
        watch.delivered_by(len(watch.delivered))
        return data

    def __del__(self):
        self._self_watch.shut_down(())

    def _refuse(self, exc):
        worker = tp.worker_named_in(F.exception_text(exc))
        try:
            pid = None if worker is None else tp.worker_processes(self.__wrapped__)[worker].pid
        except Exception:  # a torch that moved its names: the worker alone
            pid = "?"
        what = F.Failure(F.REMEDY, exc, worker, pid).what(room=160)
        self._self_watch.held(failed=what)
        fix = process_state.FIX if process_state.REFUSED in what else None
        raise NoExactRung("%s\n  and no rung below can take over: %s, and only a watched "
                          "start can resume on another rung" % (what, self._self_unwatched),
                          fix) from None
