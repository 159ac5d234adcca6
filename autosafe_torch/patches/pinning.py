"""torch's ``pin_memory(data, device)``, which refuses a tensor already on an
accelerator (DL305). It recurses through a batch by its module-level name,
so replacing that name puts this function at every level: a tensor torch
refuses is handed on as it is, the rest pinned as asked. It looks at
nothing until torch raised.
"""

import threading

from .. import callsite, engine
from ..rules import Context
from ..torch_private import pin_memory_module
from . import replace


def patch(torch):
    module = pin_memory_module()
    torch_s = module.pin_memory

    def pin_memory(data, *args, **kwargs):
        try:
            return torch_s(data, *args, **kwargs)
        except RuntimeError as exc:
            if engine.fail_open(False, "pin_memory", _unpinned, data, exc):
                return data
            raise

    replace(module, "pin_memory", pin_memory)


def _unpinned(data, exc):
    """Whether ``data``, which torch could not pin, goes on as it is (DL305)."""
    found, _ = engine.run_checks("dataloader.pin", {"batch": data, "error": exc},
                                 Context(None))
    if not found:
        return False
    site = callsite.site_of_pin_thread(threading.current_thread()) \
        or callsite.user_call_site()
    return engine.settle(found, site) or False
