"""``DataLoader.__init__`` and ``DataLoader._get_iterator``.

Arguments that DataLoader refuses to change after ``__init__`` (or rejects
inside it; a subclass's ``super().__init__`` too) are corrected before the
original runs; the worker checks run when an iterator is created, since the
start method may change in between. The one path of a repaired loader: this
patch → ``engine.loader`` → ``recovery``.
"""

import functools
import sys

from torch.utils.data import DataLoader

from .. import callsite, engine
from ..engine import loader as plans
from ..loaderstate import state_of
from ..torch_private import GET_ITERATOR
from . import Signature, bind, wrap


def patch(torch):
    wrap(DataLoader, "__init__", functools.partial(_init_wrapper, Signature(DataLoader.__init__)))
    wrap(DataLoader, GET_ITERATOR, _iterator_wrapper)


def _init_wrapper(signature, wrapped, instance, args, kwargs):
    bound = bind(signature, args, kwargs)
    if bound is None:
        return wrapped(*args, **kwargs)  # the user's own mistake: torch says it
    arguments, values = bound
    decided = engine.fail_open(None, "DataLoader.__init__", plans.decide_construction, values,
                               signature.defaults, instance)
    if decided is None:
        result = wrapped(*args, **kwargs)
    else:
        changed, applied = decided
        arguments.arguments.update(changed)
        result = wrapped(*arguments.args, **arguments.kwargs)
        plans.keep_state(instance, applied)
    engine.fail_open(None, "DataLoader warm start", plans.warm_start_ahead, instance,
                     sys._getframe(1))
    return result


def _iterator_wrapper(wrapped, loader, args, kwargs):
    engine.fail_open(None, "DataLoader iteration", plans.decide_iteration, loader,
                     sys._getframe(1))
    from .. import recovery  # noqa: PLC0415 - 3.9 ms at `import torch`, where the patches load (-X importtime: recovery and the 19 modules it loads: isolation, loggers, rungs, copies...)

    # The records of this iteration's findings: made once their remedies held.
    state = state_of(loader)
    pending, state.pending = state.pending, []
    if loader.num_workers and state.kept.emulated_workers == loader.num_workers:
        iterator = recovery.emulated(loader, pending, lambda: wrapped(*args, **kwargs))
    else:
        iterator = recovery.watched(loader, wrapped, args, kwargs, pending)
    if loader.pin_memory and loader.num_workers:
        callsite.pin_thread_serves(iterator, callsite.iteration_site(loader))
    device = state.kept.batch_device
    if device is not None:
        from ..remedies.batchdevice import BatchesTo  # noqa: PLC0415 - 0.1 ms at `import torch`, where the patches load (-X importtime: remedies.batchdevice)

        iterator = BatchesTo(iterator, device)
    return iterator
