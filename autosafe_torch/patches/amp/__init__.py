"""AMP: autocast, GradScaler and custom_fwd/custom_bwd (AMP501-AMP506).

Of the deprecated ``torch.cuda.amp.autocast`` / ``torch.cpu.amp.autocast``
only ``__new__`` and ``__init_subclass__``, which only warn, are replaced:
the classes stay the classes (isinstance, subclassing, ``type(x)``), and
torch's own ``__init__`` still maps the old positional order (enabled,
dtype, cache_enabled) onto torch.amp's.

All by feature, not by version number: whether a class is marked deprecated,
whether ``torch.amp`` has the modern class and its signature a device, and
what ``torch.amp.autocast`` accepts, probed once.
"""

import functools

from ...rules.amp import AmpCall
from .. import Signature, original, replace, wrap
from . import autocast, provided, scaler
from .caps import TorchAmpCaps
from .common import is_deprecated, is_subclass, state


def patch(torch):
    amp = torch.amp
    autocast_cls = amp.autocast_mode.autocast
    init = autocast_cls.__dict__["__init__"]
    state["caps"] = TorchAmpCaps(autocast_cls, init)
    state["autocast_call"] = AmpCall("torch.autocast")
    replace(autocast_cls, "__init__", autocast.make_init(init))

    # AMP501: the deprecated autocast classes and decorators.
    old_amp = {area: getattr(getattr(torch, area, None), "amp", None) for area in ("cuda", "cpu")}
    for area, module in old_amp.items():
        legacy = getattr(module, "autocast", None)
        if not is_subclass(legacy, autocast_cls):
            continue
        call = AmpCall("torch.%s.amp.autocast" % area, device=area, takes_device=False,
                       route="torch.amp.autocast(%r)" % area)
        if is_deprecated(legacy) and "__new__" in legacy.__dict__:
            autocast.patch_deprecated(legacy, call, autocast_cls)
        elif is_deprecated(legacy.__dict__.get("__init__")):  # torch 2.4-2.8 mark __init__
            autocast.patch_deprecated_init(legacy, call)
    cuda_amp = old_amp["cuda"]
    if cuda_amp is not None and hasattr(amp, "custom_fwd") and hasattr(amp, "custom_bwd") \
            and is_deprecated(getattr(cuda_amp, "custom_fwd", None)):
        for name in ("custom_fwd", "custom_bwd"):
            call = AmpCall("torch.cuda.amp.%s" % name, device="cuda", takes_device=False,
                           route="torch.amp.%s(device_type='cuda')" % name)
            decorator = autocast.routed(call, "", getattr(cuda_amp, name),
                                        functools.partial(getattr(amp, name), device_type="cuda"))
            for owner in (cuda_amp, getattr(cuda_amp, "autocast_mode", None)):
                if owner is not None and hasattr(owner, "custom_fwd"):
                    replace(owner, name, decorator)

    # AMP502-AMP504: GradScaler.
    modern = getattr(amp, "GradScaler", None)
    if isinstance(modern, type) and "device" in Signature(modern.__init__).parameters:
        wrap(modern, "__init__", scaler.wrapper(AmpCall("torch.amp.GradScaler"),
                                                Signature(modern.__init__)))
    else:
        modern = None
    cuda_scaler = None
    for area, module in old_amp.items():
        legacy = getattr(module, "GradScaler", None)
        if not isinstance(legacy, type) or legacy is modern:
            continue
        signature = Signature(legacy.__dict__.get("__init__", legacy.__init__))
        if "device" in signature.parameters:
            continue
        route_init = original(modern, "__init__") if is_subclass(legacy, modern) else None
        call = AmpCall("torch.%s.amp.GradScaler" % area, device=area, takes_device=False,
                       route="torch.amp.GradScaler" if route_init else None)
        wrap(legacy, "__init__", scaler.wrapper(call, signature, route_init))
        if area == "cuda":
            cuda_scaler = legacy

    # AMP506: new code on old torch.
    if modern is None and cuda_scaler is not None and not hasattr(amp, "GradScaler"):
        grad_scaler = provided.grad_scaler(cuda_scaler, original(cuda_scaler, "__init__"))
        replace(amp, "GradScaler", grad_scaler)
        if not hasattr(torch, "GradScaler"):
            replace(torch, "GradScaler", grad_scaler)
    if not hasattr(amp, "autocast") and hasattr(torch, "autocast"):
        replace(amp, "autocast", provided.autocast(torch))


def unpatch():
    autocast._autocast_plans.clear()
    state.clear()
