"""``DataLoader.__init__`` and ``DataLoader._get_iterator``.

Arguments that DataLoader refuses to change after ``__init__`` (and those it
rejects inside ``__init__``) are corrected at construction, before the
original runs. Subclasses are covered: their ``super().__init__`` lands in
this wrapper. The worker decision (rules/workers.py) is made when an
iterator is created, since the start method may change in between; it is
cached per loader and re-made only when what it depends on changes.
"""

import inspect

from .. import engine, facts
from .. import callsite
from . import wrap

# Findings may carry values that are no DataLoader argument but state the
# loader keeps for its iterators (``batch_device``); stored under this prefix,
# as is the cached worker decision.
STATE_PREFIX = "_autosafe_torch_"
_PLAN_ATTR = STATE_PREFIX + "plan"

_signature = {}


def init_checks():
    """The DataLoader checks, in the registry's order: each rule module with a
    ``CHECKS`` tuple adds it; later checks see the arguments as the earlier
    ones left them (DL104 settles the worker count before the rest look)."""
    if "checks" not in _signature:
        import importlib

        from ..rules import RULE_MODULES

        _signature["checks"] = tuple(
            check for name in RULE_MODULES
            for check in getattr(importlib.import_module(name), "CHECKS", ()))
    return _signature["checks"]


def patch(torch):
    from torch.utils.data import DataLoader

    sig = inspect.signature(DataLoader.__init__)
    params = list(sig.parameters.values())[1:]  # without self
    _signature["sig"] = sig.replace(parameters=params)
    _signature["defaults"] = {p.name: p.default for p in params
                              if p.default is not inspect.Parameter.empty}
    wrap(DataLoader, "__init__", _init_wrapper)
    wrap(DataLoader, "_get_iterator", _iterator_wrapper)


def _init_wrapper(wrapped, instance, args, kwargs):
    try:
        bound = _signature["sig"].bind(*args, **kwargs)
    except TypeError:
        return wrapped(*args, **kwargs)  # the user's own mistake: torch says it
    decided = engine.decide_or(None, "DataLoader.__init__", _decide, bound, instance)
    if decided is None:
        return wrapped(*args, **kwargs)
    new, loader_state = decided
    result = wrapped(*new.args, **new.kwargs)
    for name, value in loader_state.items():
        instance.__dict__[STATE_PREFIX + name] = value
    return result


def _decide(bound, instance):
    """(bound arguments to call with, loader state to keep), or None: unchanged."""
    values = dict(_signature["defaults"])
    values.update(bound.arguments)
    context = values.get("multiprocessing_context")
    found, fixed = engine.run_checks(init_checks(), values,
                                     facts.current(context), _signature["defaults"])
    # Always: the site is the loader's origin, which loaders built from it inherit.
    site = callsite.loader_site(instance, values.get("dataset"))
    if not engine.settle(found, site):
        return None
    loader_state = {}
    for name in {k for f in found for k in f.after}:
        if name in _signature["sig"].parameters:
            bound.arguments[name] = fixed[name]
        else:
            loader_state[name] = fixed[name]
    return bound, loader_state


# -- the worker decision, at iteration -----------------------------------------

def _iterator_wrapper(wrapped, loader, args, kwargs):
    threads = engine.decide_or(0, "DataLoader iteration", _decide_workers, loader)
    if threads:
        from ..threadworkers import ThreadWorkersIter

        iterator = ThreadWorkersIter(loader, threads)
    else:
        iterator = wrapped(*args, **kwargs)
    device = loader.__dict__.get(STATE_PREFIX + "batch_device")
    if device is not None:
        from ..batchdevice import BatchesTo

        iterator = BatchesTo(iterator, device)
    return iterator


def _plan_key(loader, context):
    return (loader.num_workers, facts.effective_start_method(context), id(loader.dataset),
            id(loader.collate_fn), id(loader.worker_init_fn), facts.cuda_initialized())


def _decide_workers(loader):
    """Apply the worker findings to ``loader``; the thread count for rung 3, or 0."""
    state = loader.__dict__
    context = loader.multiprocessing_context
    key = _plan_key(loader, context)
    cached = state.get(_PLAN_ATTR)
    if cached is not None and cached[0] == key:
        return cached[1]
    threads = 0
    if loader.num_workers:
        threads = _plan_and_apply(loader, context, key[1])
        key = _plan_key(loader, loader.multiprocessing_context)
    state[_PLAN_ATTR] = (key, threads)
    return threads


def _plan_and_apply(loader, context, method):
    import sys

    from torch.utils.data import IterableDataset

    from ..config import CONFIG
    from ..rules import workers

    guarded = True
    if method in ("spawn", "forkserver"):
        guarded = workers.main_is_guarded(sys._getframe())
    view = workers.LoaderView(loader.num_workers, method, loader.dataset, loader.collate_fn,
                              loader.worker_init_fn, isinstance(loader.dataset, IterableDataset),
                              guarded)
    found = workers.plan(view, facts.current(context),
                         lambda code: CONFIG.rule_enabled(code, workers.GROUP))
    try:
        applied = engine.settle(found, callsite.iteration_site(loader) if found else None)
    finally:
        if found and CONFIG.mode != "fix":
            from .. import repairs

            repairs.uninstall_reducers()  # planning registered them; warn changes nothing
    if not applied:
        return 0
    threads = 0
    for finding in found:
        for name, value in finding.after.items():
            if name == "thread_workers":
                threads = value
            else:
                setattr(loader, name, value)
    if loader.num_workers == 0:
        loader.timeout = 0  # a worker timeout; torch refuses it without workers
    return threads
