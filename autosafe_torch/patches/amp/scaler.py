"""GradScaler's ``__init__``: a legacy one (``torch.cuda.amp``'s, the CPU one)
bound to its old signature and built through ``torch.amp.GradScaler.__init__``
by keyword (AMP502), with a device (AMP504); the modern one: AMP503."""

from ... import engine
from ...callsite import cached_call_site
from ...rules.amp import device_type
from .. import bind
from .common import run


def _scaler_plan(instance, call, signature, args, kwargs):
    """(device or None, scaler keyword arguments) to build with, or None."""
    device = None
    if "device" not in signature.parameters:
        # torch.cuda.amp.GradScaler("cuda") or (device="cuda"): new code, old class.
        if "device" in kwargs:
            kwargs = dict(kwargs)
            device = kwargs.pop("device")
        elif args and (isinstance(args[0], str) or type(args[0]).__name__ == "device"):
            device, args = args[0], args[1:]
    bound = bind(signature, args, kwargs)
    if bound is None:
        return None
    bound[1].setdefault("device", device)  # bound: every parameter, defaults filled in
    found, fixed = run("scaler", bound[1], call)
    if not found or not engine.settle(found, cached_call_site(instance)):
        return None
    params = {name: fixed[name] for name in signature.parameters if name != "device"}
    return device_type(fixed["device"]) or call.device or "cuda", params


def wrapper(call, signature, route_init=None):
    """A GradScaler.__init__ wrapper: plan (failing open), then build as planned:
    ``torch.amp.GradScaler`` by its own ``__init__`` (``signature`` takes a
    device), a legacy one by ``route_init`` (torch.amp's), else without a device."""

    def init(wrapped, instance, args, kwargs):
        plan = engine.fail_open(None, "%s.__init__" % call.api, _scaler_plan, instance, call,
                                signature, args, kwargs)
        if plan is None:
            return wrapped(*args, **kwargs)
        device, params = plan
        if "device" in signature.parameters:
            return wrapped(device, **params)
        if route_init is not None:
            return route_init(instance, device, **params)
        return wrapped(**params)

    return init
