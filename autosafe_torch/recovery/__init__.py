"""Recover from a failure of a loader's workers: same batches, none lost or repeated.

``watched`` builds torch's multi-process iterator, watched (``watch.py``:
deaths, hangs, a worker's reported failure), inside a ``RecoveringIter``
(``iterator.py``), which rebuilds it on the ladder's next rung (``rungs.py``,
``rules/ladder.py``) and resumes at the first batch not yet delivered. Each
worker runs faulthandler into a file of ours: a crash leaves its traceback
there, and ``SIGUSR1`` every thread's stack, which explains a hang.

Exact by replay: a worker's random state after n fetches is known only by
making them, so the new iterator is the old one again (the same base seed,
the sampler's recorded indices then the old sampler iterator itself, the
same round-robin dispatch) and the batches already delivered are fetched
again and dropped. Every batch then reaches the user once, as in a run
without the failure (per-worker RNG state, ``worker_init_fn`` effects,
IterableDataset shards); skipping would be exact only for datasets that draw
nothing. Not exact, and said so: a persistent loader after its first epoch
(earlier epochs' worker states are not replayed); side effects outside the
worker happen again for the replayed fetches. Not watched: ``in_order=False``
(which batches were delivered depends on timing) and DataPipes.
torch_private.py's NOTE [the data flow of a repaired loader] follows a batch
from the sampler to the user and back.
"""

import contextlib
import functools
import logging

from .. import callsite, engine
from .. import torch_private as tp
from ..config import CONFIG
from ..errors import NoExactRung
from ..loaderstate import state_of
from ..remedies import isolation
from ..remedies.workerinit import with_step
from ..report import log, shorten_line
from ..rung import Rung
from ..rules import OutcomeContext, number_of
from ..rules.recovery import kinds_watched, start_failures_recovered
from .iterator import RecoveringIter, UnwatchedIter
from .rungs import Emulated, ladder_of, own_files, real_workers, sending_to_workers, torch_lacks
from .watch import Failed, Watch, record_held

__all__ = ["watched", "emulated", "RecoveringIter"]


def watched(loader, wrapped, args, kwargs, pending=()):
    """``wrapped(*args, **kwargs)`` (``DataLoader._get_iterator``), watched and
    recovered where that is exact; unchanged otherwise, or on an error of ours.
    ``pending``: this iteration's records, made once their remedies held."""
    kinds = engine.fail_open(_NOT_OURS, "DataLoader recovery", _kinds_watched, loader, wrapped)
    if isinstance(kinds, str):
        return _unwatched(loader, wrapped, args, kwargs, pending, kinds)
    return _start(loader, kinds, pending)


def _unwatched(loader, wrapped, args, kwargs, pending, why):
    """torch's own iterator, each worker's own files first. The records wait
    for the batches (``UnwatchedIter``) where this torch cannot be watched or
    the workers say what they did (DL220); else they are made now."""
    table = engine.fail_open(None, "DataLoader worker isolation", own_files, loader) \
        if loader.num_workers else None
    init = None if table is None else \
        with_step(loader.worker_init_fn, isolation.worker_step(table), first=True)
    with _warm_starts(pending), sending_to_workers(loader, init):
        iterator = wrapped(*args, **kwargs)
    if pending and loader.num_workers and CONFIG.mode == "fix":
        missing = tp.watched_missing()
        if missing or any(r.needed for r in pending):
            why = "this torch cannot watch its workers (it lacks %s)" % shorten_line(missing, 80) \
                if missing else "its workers are not watched (%s)" % why
            return UnwatchedIter(iterator, pending, loader.num_workers, why)
    record_held(pending)
    return iterator


def emulated(loader, pending=(), torch_s=None):
    """The emulated-workers rung a rule chose for ``loader``; its records once
    every worker has its copy (else as what happened). ``torch_s()`` makes
    torch's own iterator, for a torch that lacks what emulated workers need."""
    if torch_s is not None and torch_lacks("emulated"):
        record_held(pending, "this torch lacks what emulated workers need")
        return torch_s()
    try:
        iterator = Emulated(loader)
    except NoExactRung as refused:
        record_held(pending, refused.reason)
        not_rebuilt = state_of(loader).kept.not_rebuilt
        if not_rebuilt:  # the rung above was refused too: why
            raise NoExactRung("%s\n  %s" % (refused.reason, not_rebuilt), refused.fix) \
                from None
        raise
    record_held(pending)
    return iterator


_NOT_OURS = "its iterator is not torch's, or the recovery rules are off"


def _kinds_watched(loader, wrapped):
    """The failure kinds a watched iterator recovers from, or why none (a str):
    torch's own iterator runs."""
    if CONFIG.mode != "fix" or not loader.num_workers:
        return "off"
    if not getattr(loader, "in_order", True):
        return "in_order=False"
    if isinstance(loader.dataset, tp.DATAPIPES):
        return "a DataPipe"
    if getattr(wrapped, "__func__", None) is not tp.original_get_iterator() \
            or not tp.iterator_class_is_torchs():
        return _NOT_OURS  # someone else's iterator: not ours to rebuild
    kinds = kinds_watched(engine.enabled)
    return kinds if kinds and not torch_lacks("watched") else _NOT_OURS


def _start(loader, kinds, pending):
    ladder = ladder_of(loader)
    if ladder.rung is Rung.EMULATED:  # this loader's workers failed on every real rung
        return emulated(loader, pending)
    callsite.as_if_called_from(  # its warning names torch's line, as without the shim
        tp.original_get_iterator(), loader.check_worker_number_rationality)
    site = callsite.iteration_site(loader)
    outcome = isolation.Outcome(None, functools.partial(_say_used, site, pending,
                                                        loader.num_workers))
    watch = Watch(kinds, CONFIG.hang_timeout, loader.timeout, pending, loader.num_workers,
                  outcome, start_recovered=start_failures_recovered(engine.enabled))
    try:
        with _warm_starts(pending):
            return RecoveringIter(real_workers(loader, ladder, watch), loader, ladder, watch)
    except Failed as failed:  # its workers could not start (``Watch.start_failed``)
        recovering = RecoveringIter(failed.iterator, loader, ladder, watch)
        recovering._recover_or_raise(failed.failure)  # on the next rung already
        return recovering


@contextlib.contextmanager
def _warm_starts(pending):
    """Around the start of this iterator's workers: once they started, DL209's
    record (from where the warm starts stood before)."""
    if not any(i.rung is Rung.WARM_SPAWN for i in pending):
        yield
        return
    from ..remedies import warmstart  # noqa: PLC0415 - 0.4 ms at each program's first DataLoader iterator, where this module loads (-X importtime after torch and recovery: remedies.warmstart)

    started = warmstart.starts()
    mark = started.mark()
    yield
    engine.fail_open(None, "DataLoader records", _warm_outcome, pending, started, mark)


def _warm_outcome(pending, started, mark):
    """DL209's record: from the warm server, or, where some workers came by
    plain spawn, a fix that did not hold, and why (its own line)."""
    warm_started, plain, built = started.since(mark)
    for warm in [i for i in pending if i.rung is Rung.WARM_SPAWN]:
        if built and built == warm_started and not plain:
            warm.done += "; the dataset built once, there, not in each worker"
        if not plain:
            continue
        for host in pending:
            if warm in host.clauses:
                host.clauses.remove(warm)
        warm.failed("%s started by plain spawn: %s" % (
            number_of(plain, "worker"), started.reason or "the warm server did not start"))


def _say_used(site, pending, workers, usage):
    """The records of what the workers read through descriptions of their own
    (``dataloader.outcome``; ``pending`` may have named some already)."""
    if usage.missing:
        log(logging.DEBUG, "%s: not reached in the workers (the number holds another file "
            "there): %s", site, "; ".join("%s: %s" % item for item in usage.missing.items()))
    found = engine.run_checks("dataloader.outcome", {},
                              OutcomeContext(None, usage=usage, workers=workers,
                                             said=pending))[0]
    if found:
        engine.settle(found, site)
