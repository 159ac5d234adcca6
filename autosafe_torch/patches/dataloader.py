"""``DataLoader.__init__`` and ``DataLoader._get_iterator``.

Arguments that DataLoader refuses to change after ``__init__`` (and those it
rejects inside ``__init__``) are corrected at construction, before the
original runs: the checks at ``dataloader.init``. Subclasses are covered:
their ``super().__init__`` lands in this wrapper. The worker checks
(``dataloader.iter``) run when an iterator is created, since the start
method may change in between; their outcome is cached per loader and
re-made only when what it depends on changes.

A finding's ``changes`` become the call's arguments (or, at iteration, the
loader's attributes); its ``state`` is kept on the loader for its iterators
(``batch_device``, ``emulated_workers``, ``fork_handles``) under
``STATE_PREFIX``. The records of the worker checks are made once their
remedies held in the workers (``patches/supervisor.py``), not when planned.
"""

import inspect
import sys

from .. import engine, facts
from .. import callsite
from ..config import CONFIG
from ..rules import Context
from . import wrap

STATE_PREFIX = "_autosafe_torch_"
_PLAN_ATTR = STATE_PREFIX + "plan"
# What the worker checks read off a loader, and may change on it.
ITER_ARGS = ("num_workers", "multiprocessing_context", "dataset", "collate_fn",
             "worker_init_fn", "timeout")

_signature = {}


def patch(torch):
    from torch.utils.data import DataLoader

    sig = inspect.signature(DataLoader.__init__)
    params = list(sig.parameters.values())[1:]  # without self
    _signature["sig"] = sig.replace(parameters=params)
    _signature["defaults"] = {p.name: p.default for p in params
                              if p.default is not inspect.Parameter.empty}
    wrap(DataLoader, "__init__", _init_wrapper)
    wrap(DataLoader, "_get_iterator", _iterator_wrapper)


def _keep_state(loader, findings):
    for finding in findings:
        for name, value in finding.state.items():
            loader.__dict__[STATE_PREFIX + name] = value


def loader_state(loader, name):
    return loader.__dict__.get(STATE_PREFIX + name)


# -- construction ----------------------------------------------------------------

def _init_wrapper(wrapped, instance, args, kwargs):
    try:
        bound = _signature["sig"].bind(*args, **kwargs)
    except TypeError:
        return wrapped(*args, **kwargs)  # the user's own mistake: torch says it
    decided = engine.decide_or(None, "DataLoader.__init__", _decide, bound, instance)
    if decided is None:
        result = wrapped(*args, **kwargs)
    else:
        new, applied = decided
        result = wrapped(*new.args, **new.kwargs)
        _keep_state(instance, applied)
    engine.decide_or(None, "DataLoader warm start", _warm_ahead, instance, sys._getframe(1))
    return result


def _decide(bound, instance):
    """(bound arguments to call with, findings applied), or None: unchanged."""
    values = dict(_signature["defaults"])
    values.update(bound.arguments)
    workers = values.get("num_workers")
    if not isinstance(workers, int) or workers < 0:
        return None  # torch rejects it, in its own words: nothing of ours applies
    ctx = Context(facts.current(values.get("multiprocessing_context")),
                  defaults=_signature["defaults"])
    found, work = engine.run_checks("dataloader.init", values, ctx)
    # Always: the site is the loader's origin, which loaders built from it inherit.
    site = callsite.loader_site(instance, values.get("dataset"))
    if not found or not engine.settle(found, site, work):
        return None
    for name, value in work.items():
        if value is not values[name]:
            bound.arguments[name] = value
    return bound, found


# -- iteration --------------------------------------------------------------------

def _iterator_wrapper(wrapped, loader, args, kwargs):
    engine.decide_or(None, "DataLoader iteration", _decide_workers, loader, sys._getframe(1))
    # The records of this iteration's findings: made once their remedies held.
    pending = loader.__dict__.pop(STATE_PREFIX + "pending", [])
    from . import supervisor  # watched: a worker's death or hang is recovered

    emulated = loader_state(loader, "emulated_workers")
    if emulated and emulated == loader.num_workers:
        iterator = supervisor.emulated(loader, pending, lambda: wrapped(*args, **kwargs))
    else:
        iterator = supervisor.watched(loader, wrapped, args, kwargs, pending)
    if loader.pin_memory and loader.num_workers:
        from . import pinning

        pinning.serves(iterator, callsite.iteration_site(loader))
    device = loader_state(loader, "batch_device")
    if device is not None:
        from ..remedies.batchdevice import BatchesTo

        iterator = BatchesTo(iterator, device)
    return iterator


def _plan_key(loader):
    return (tuple(id(getattr(loader, name)) for name in ITER_ARGS),
            facts.effective_start_method(loader.multiprocessing_context), _opencl_used())


def _opencl_used():
    # CV402: the program's first OpenCL use between epochs changes the plan.
    from ..remedies.cv2 import opencl_runtime_loaded

    return opencl_runtime_loaded()


def _decide_workers(loader, frame):
    """Run the worker checks for ``loader`` once per state of what they read."""
    state = loader.__dict__
    key = _plan_key(loader)
    if state.get(_PLAN_ATTR) == key:
        return
    if loader.num_workers:
        _check_workers(loader, frame)
    state[_PLAN_ATTR] = _plan_key(loader)


def _plan_workers(loader, frame, fork_failed=None):
    """The worker checks' findings for ``loader`` and the arguments they leave:
    planned, nothing applied. ``fork_failed``: the failure of its forked
    workers that rules fork out (``Context.fork_failed``)."""
    from ..inspection.mainmodule import main_is_guarded

    guarded = []

    def main_guarded():
        if not guarded:
            guarded.append(main_is_guarded(frame))
        return guarded[0]

    values = {name: getattr(loader, name) for name in ITER_ARGS}
    ctx = Context(facts.current(loader.multiprocessing_context), main_guarded=main_guarded,
                  fork_failed=fork_failed)
    found, work = engine.run_checks("dataloader.iter", values, ctx)
    return values, found, work


def _check_workers(loader, frame):
    values, found, work = _plan_workers(loader, frame)
    if found:
        loader.__dict__[STATE_PREFIX + "pending"] = _apply(loader, values, found, work)


def _apply(loader, values, found, work, unsaid=()):
    """Settle the worker checks' findings for ``loader`` and, in fix mode, set
    the arguments they changed and keep their state; the records, to be made
    once the remedies held in the workers (but those of the codes in
    ``unsaid``, which another record says)."""
    applied, made = engine.settle_later(found, callsite.iteration_site(loader), work)
    if applied:
        for name in ITER_ARGS:
            if work[name] is not values[name]:
                setattr(loader, name, work[name])
        _keep_state(loader, found)
    return [record for record in made if record.code not in unsaid]


def plan_without_fork(loader, failure, frame):
    """After ``failure`` of ``loader``'s forked workers (one touched CUDA): the
    worker checks again, with fork ruled out, applied where they start the
    workers by spawn (DL205, with the repairs and the warm start that spawn
    needs). Returns the records to make once the new workers delivered, or
    None where spawn cannot reach them (emulated workers), nothing applied.
    The loader keeps the plan for its later epochs."""
    if CONFIG.mode != "fix":
        return None
    values, found, work = _plan_workers(loader, frame, fork_failed=failure)
    moved = [f for f in found if f.rule.code == "DL205"]
    if not moved or moved[0].changes.get("multiprocessing_context") != "spawn" \
            or any(f.state.get("emulated_workers") for f in found):
        return None
    # DL205 is said by the recovery's record, once the new workers delivered.
    made = _apply(loader, values, found, work, unsaid=("DL205",))
    loader.__dict__[_PLAN_ATTR] = _plan_key(loader)
    return made


def _warm_ahead(loader, frame):
    """At construction: where the worker checks will start this loader's
    workers warm (DL209: a loader repaired for spawn), the warm server starts
    now, in the background, so that its imports overlap the program's setup.
    Only planned here (recorded and applied at the first iterator, as ever);
    a loader that forks, or one that needs no repair, starts nothing."""
    if not loader.num_workers or CONFIG.mode != "fix" or not _may_spawn(loader):
        return
    from ..inspection.probe import probe_loader_parts

    from ..rules.workers import attribute_forwarders

    parts = {"dataset": loader.dataset, "collate_fn": loader.collate_fn,
             "worker_init_fn": loader.worker_init_fn}
    if facts.effective_start_method(loader.multiprocessing_context) == "spawn" \
            and not probe_loader_parts(*parts.values()) and not attribute_forwarders(parts):
        # A healthy spawn loader: no repair, no warm start (the common case, cheap).
        # A forwarder pickles, but its unpickling recurses: DL201 repairs it.
        return
    _values, found, work = _plan_workers(loader, frame)
    if any(f.rule.code == "DL209" and f.strategy == "warm forkserver" for f in found):
        from ..remedies import warmstart

        warmstart.start_ahead(warmstart.libraries_for(
            [work["dataset"], work["collate_fn"], work["worker_init_fn"]]))


def _may_spawn(loader):
    """Whether the workers may start by spawn: the start method, or fork where the
    ladder moves it away (macOS). Cheap: no probe. Not for CUDA initialised in
    this process: fork stays unless its workers touch CUDA (DL205, recovered)."""
    method = facts.effective_start_method(loader.multiprocessing_context)
    return method == "spawn" or method == "fork" and facts.Facts().platform == "darwin"
