"""AMP506: ``torch.amp.GradScaler`` and ``torch.amp.autocast`` on a torch that
predates them, built from what it has."""

import wrapt

from ... import engine
from ...callsite import cached_call_site
from ...rules.amp import AmpCall
from .common import run


def _missing(name):
    return AttributeError("module 'torch.amp' has no attribute '%s'" % name)


def grad_scaler(legacy, legacy_init):
    call = AmpCall("torch.amp.GradScaler", takes_device=True,
                   route="torch.cuda.amp.GradScaler", provided=True)

    class GradScaler(legacy):
        __doc__ = ("torch.amp.GradScaler provided by autosafe_torch (AMP506): this "
                   "torch has only torch.cuda.amp.GradScaler, which this builds.")

        def __init__(self, device="cuda", init_scale=2.0 ** 16, growth_factor=2.0,
                     backoff_factor=0.5, growth_interval=2000, enabled=True):
            params = {"init_scale": init_scale, "growth_factor": growth_factor,
                      "backoff_factor": backoff_factor, "growth_interval": growth_interval,
                      "enabled": enabled}
            found, fixed = run("scaler", dict(params, device=device), call)
            if not engine.settle(found, cached_call_site(self)):
                raise _missing("GradScaler")  # warn mode: as without autosafe_torch
            legacy_init(self, **{name: fixed[name] for name in params})

    GradScaler.__module__ = "torch.amp"
    GradScaler.__qualname__ = "GradScaler"
    return GradScaler


def autocast(torch):
    call = AmpCall("torch.amp.autocast", route="torch.autocast", provided=True)

    def wrapper(wrapped, instance, args, kwargs):
        found = run("amp.provided", {}, call)[0]
        if not engine.settle(found, cached_call_site()):
            raise _missing("autocast")
        return wrapped(*args, **kwargs)

    return wrapt.FunctionWrapper(torch.autocast, wrapper)
