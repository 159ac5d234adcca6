"""What a watched iterator sees while it waits (the hooks of
``torch_private.Watched``): deliveries, deaths, hangs, each made a ``Failure``
for the recovery."""

import time

from .. import engine
from .. import torch_private as tp
from ..inspection import failures as F

POLL_S = 0.1          # how often a waiting iterator looks at its workers
HANG_FACTOR = 10      # the limit, in slowest waits seen
STARTUP_FACTOR = 3    # while workers start (spawn imports torch in each) ...
STARTUP_MIN_S = 30.0  # ... and at least this (measured: 6 s for 2 spawn workers, busy 2 cores)
DEATH_WAIT_S = 0.5    # for a death behind a broken connection to show


class Failed(Exception):
    """A failure of the workers, on its way from ``_get_data`` to ``RecoveringIter``."""

    def __init__(self, failure, iterator=None):
        super().__init__(failure)
        self.failure = failure
        self.iterator = iterator  # one whose workers could not start: to stop, to go on from


class Watch:
    """What a ``RecoveringIter`` keeps across its inner iterators (it refers to
    neither, so that dropping the iterator still shuts its workers down): the
    epoch's drawn indices (``recorder``), the slowest wait, the limits, the
    records waiting for every worker to deliver, the workers' ``outcome``."""

    __slots__ = ("recorder", "slowest", "fresh", "floor", "timeout", "kinds", "pending",
                 "delivered", "workers", "outcome", "start_recovered")

    def __init__(self, kinds, floor, timeout, pending=(), workers=0, outcome=None,
                 start_recovered=True):
        self.recorder = None
        self.slowest = 0.0
        self.fresh = True
        self.kinds = kinds
        self.floor = floor if F.HUNG in kinds else 0
        self.timeout = timeout if timeout and timeout > 0 else 0
        self.pending = list(pending)
        self.delivered = set()
        self.workers = workers
        self.outcome = outcome
        # rules.recovery.start_failures_recovered: a start that fails here goes on
        self.start_recovered = start_recovered

    # -- the hooks of torch_private.Watched, in the order they run --

    def starting(self):
        self.fresh = True

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

    def failed(self, iterator, exc):
        """``Failed`` to raise instead of ``exc`` (raised while a batch was
        awaited) for a death or an error of a known kind; None: torch's error."""
        kind = F.exception_kind(exc)
        dead = tp.dead_workers(iterator)
        deadline = time.monotonic() + DEATH_WAIT_S
        while not dead and kind is None and F.lost_peer(exc) and time.monotonic() < deadline:
            time.sleep(0.02)
            dead = tp.dead_workers(iterator)
        if dead:
            worker, process = dead[0]
            return Failed(F.Failure(kind or F.death_kind(process.exitcode), exc, worker,
                                    process.pid, F.exit_status(process.exitcode)))
        return Failed(F.Failure(kind, exc)) if kind else None

    def start_failed(self, iterator, exc):
        """A worker could not start: what it is sent did not pickle, and new
        workers would be sent the same, so the recovery steps down. None where
        its rule, or one that repairs what workers are sent, is off."""
        if F.REMEDY not in self.kinds or not self.start_recovered:
            return None
        failure = F.Failure(F.REMEDY, exc)
        failure.starting = True
        return Failed(failure, iterator)

    def hung(self, worker, pid, waited):
        return Failed(F.Failure(F.HUNG, worker=worker, pid=pid, waited=waited))

    def delivered_by(self, worker):
        """``worker`` handed over a batch: it started, with every step of ours
        (NOTE [the data flow of a repaired loader], step 4)."""
        if self.pending:
            self.delivered.add(worker)
            if len(self.delivered) >= self.workers:
                self.held()

    def shut_down(self, workers):
        """torch shut the workers down (an epoch's end, or the iterator dropped)."""
        if self.pending and self.delivered:  # dropped early: those that delivered held
            self.held()
        if self.outcome is not None:
            engine.fail_open(None, "DataLoader worker reports", self.outcome.workers_exited,
                             workers)

    # -- the records waiting on the workers --

    def held(self, failed=None):
        """Every worker delivered (or the epoch ended): ``record_held``."""
        pending, self.pending = self.pending, []
        record_held(pending, failed)

    def did_not_hold(self, failure):
        """A remedy the workers could not apply, or a failed start."""
        if self.pending and (failure.kind == F.REMEDY or failure.starting):
            self.held(failure.what())


def record_held(pending, failed=None):
    """The pending records as fixed, or as fixes that did not hold and why (``failed``)."""
    if pending:
        engine.fail_open(None, "DataLoader records",
                         lambda: [engine.record_outcome(i, failed=failed) for i in pending])


# -- from an exception to a Failure --------------------------------------------------

def raised_in_worker(iterator, exc):
    """A failure of a watched kind a worker reported as its batch's error, as a
    ``Failure``; None: the user's error."""
    kind = F.exception_kind(exc)
    if kind is None or not isinstance(iterator, tp.Watched):
        return None
    text = F.exception_text(exc)
    worker = tp.worker_named_in(text)
    processes = tp.worker_processes(iterator)
    pid = processes[worker].pid if worker is not None and worker < len(processes) else None
    failure = F.Failure(kind, exc, worker, pid)
    if kind == F.CUDA:  # the worker's own traceback, as torch passed it on: the user's line
        failure.dump = text
    return failure
