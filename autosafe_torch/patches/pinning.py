"""torch's ``pin_memory(data, device)``: batches that hold accelerator tensors.

With ``pin_memory=True`` torch pins every tensor of every batch, in the main
process without workers (``_SingleProcessDataLoaderIter``) and in the
pin-memory thread with them. A tensor already on an accelerator cannot be
pinned: ``RuntimeError: cannot pin 'torch.cuda.FloatTensor' only dense CPU
tensors can be pinned``, at the first batch of a dataset built on the GPU,
or of CUDA tensors that spawn workers send by CUDA IPC. Pinning is only a
faster copy from the CPU; such a tensor needs none (DL305).

torch's function recurses through a batch by its module-level name, so
replacing that name puts this function at every level: where torch refuses
a tensor, that tensor is handed on as it is, and the rest of the batch is
pinned as asked. Every batch passes through it; it looks at nothing until
torch raised.
"""

import threading
import weakref

from .. import callsite, engine
from ..rules import Context
from . import replace

_sites = weakref.WeakKeyDictionary()  # a pin-memory thread -> its loader's iteration site


def patch(torch):
    from torch.utils.data._utils import pin_memory as module

    torch_s = module.pin_memory

    def pin_memory(data, *args, **kwargs):
        try:
            return torch_s(data, *args, **kwargs)
        except RuntimeError as exc:
            if engine.decide_or(False, "pin_memory", _unpinned, data, exc):
                return data
            raise

    replace(module, "pin_memory", pin_memory)


def serves(iterator, site):
    """``iterator``'s pin-memory thread, if it has one, serves the loader
    iterated at ``site``: the line DL305 names (the thread has no user frame)."""
    thread = getattr(iterator, "_pin_memory_thread", None)
    if thread is not None:
        _sites[thread] = site


def _unpinned(data, exc):
    """Whether ``data``, which torch could not pin, goes on as it is (DL305)."""
    found, _ = engine.run_checks("dataloader.pin", {"batch": data, "error": exc},
                                 Context(None))
    if not found:
        return False
    site = _sites.get(threading.current_thread()) or callsite.user_call_site()
    return engine.settle(found, site) or False
