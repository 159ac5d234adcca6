"""AMP: autocast, GradScaler and custom_fwd/custom_bwd (AMP501-AMP506).

What is patched, and why there:

- ``torch.amp.autocast.__init__`` (the class every autocast derives from):
  AMP503 and AMP505. autocast is built on every training step, so this is a
  plain function with one dict lookup on the common path: the decision is
  cached per argument tuple, and the call site is looked up only when there
  is something to record.
- the deprecated ``torch.cuda.amp.autocast`` / ``torch.cpu.amp.autocast``
  (torch >= 2.4): their ``__new__`` and ``__init_subclass__``, which only
  warn, are replaced (AMP501). The classes stay the classes: isinstance,
  subclassing and ``type(x)`` are unchanged, and torch's own ``__init__``
  still maps the old positional order (enabled, dtype, cache_enabled) onto
  ``torch.amp.autocast`` by keyword.
- ``torch.cuda.amp.GradScaler.__init__`` (and the CPU one): the old
  signature is bound and the scaler is initialised through
  ``torch.amp.GradScaler.__init__`` by keyword (AMP502), accepting a device
  (AMP504); ``torch.amp.GradScaler.__init__``: AMP503.
- ``torch.cuda.amp.custom_fwd`` / ``custom_bwd``: routed to ``torch.amp``'s.
- on a torch without them, ``torch.amp.GradScaler`` and ``torch.amp.autocast``
  are provided (AMP506).

Everything is decided by feature, not by version number: whether a class is
marked deprecated, whether ``torch.amp`` has the modern class and its
signature a device, and what ``torch.amp.autocast`` accepts, probed once.
"""

import functools
import inspect
import sys
import warnings

from .. import callsite, engine, facts
from ..config import CONFIG
from ..report import Intervention, internal_error, record
from ..rules import amp as amp_rules
from ..rules.amp import AmpCall, device_type
from . import original, replace, wrap

_CLEAN = "clean"      # cached plan: call the original unchanged
_PLAN_CACHE_LIMIT = 4096
_autocast_plans = {}  # (args, kwargs, disabled, facts override) -> _CLEAN or (findings, kwargs)
_sites = {}           # (caller code, line, its caller's code, line) -> "file:line"
_state = {}


class TorchAmpCaps:
    """What this torch's ``torch.amp.autocast`` accepts, probed once per question.

    A probe builds an autocast object through the original ``__init__`` and
    never enters it: the device type is accepted when that does not raise,
    a dtype is supported when autocast stays enabled (torch disables it with
    a warning, or raises, for a dtype the device cannot do).
    """

    def __init__(self, autocast_cls, init):
        self._cls = autocast_cls
        self._init = init
        self._accepts = {}
        self._supports = {}
        self._quiet = {}

    def autocast_accepts(self, device):
        if device not in self._accepts:
            self._accepts[device] = self._probe(device, None, False) is not None
        return self._accepts[device]

    def autocast_supports(self, device, dtype):
        key = (device, dtype)
        if key not in self._supports:
            probe = self._probe(device, dtype, True)
            self._supports[key] = probe is not None and bool(getattr(probe, "_enabled", True))
        return self._supports[key]

    def autocast_quiet_when_disabled(self, device, dtype):
        """Whether a disabled autocast with ``dtype`` builds without a warning.

        torch 2.0 checks the CPU dtype before ``enabled``: a disabled
        ``autocast("cpu", dtype=torch.float16)`` still warns there.
        """
        key = (device, dtype)
        if key not in self._quiet:
            obj = self._cls.__new__(self._cls)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    self._init(obj, device, dtype=dtype, enabled=False)
                    quiet = True
                except Exception:
                    quiet = False
            self._quiet[key] = quiet and not caught
        return self._quiet[key]

    def _probe(self, device, dtype, enabled):
        obj = self._cls.__new__(self._cls)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                self._init(obj, device, dtype=dtype, enabled=enabled)
            except Exception:
                return None
        return obj


def caps():
    return _state["caps"]


# --- call sites, cheaply -----------------------------------------------------

def _call_site(instance=None):
    """``user_call_site`` cached by the first two frames outside the libraries.

    autocast is built every step from the same line: walking the stack by
    file name is cheap, reading a frame's locals (which ``user_call_site``
    does to skip a subclass's own ``__init__``) is not.
    """
    prefixes = _state.get("library_prefixes")
    if prefixes is None:
        prefixes = _state["library_prefixes"] = callsite._library_dirs() + ("<frozen",)
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(prefixes):
        frame = frame.f_back
    if frame is None:
        return callsite.user_call_site(instance)
    back = frame.f_back
    key = (frame.f_code, frame.f_lineno,
           back.f_code if back is not None else None, back.f_lineno if back is not None else 0)
    site = _sites.get(key)
    if site is None:
        site = callsite.user_call_site(instance)
        if len(_sites) < _PLAN_CACHE_LIMIT:
            _sites[key] = site
    return site


def _run(checks, args, call):
    found, fixed = engine.run_checks(checks, args, facts.current(), caps(), call)
    return tuple(found), fixed


_repeats = {}  # (findings, call site) -> the Interventions to count again


def _settle(found, site):
    """``engine.settle``, with a repeat at the same call site counted cheaply.

    autocast is built on every step: after the first time at a site, fix
    mode only adds to the count of the records the first time made (what
    ``report.record`` does with a known (code, call site)).
    """
    if CONFIG.mode != "fix":
        return engine.settle(found, site)
    key = (found, site)
    again = _repeats.get(key)
    if again is None:
        applied = engine.settle(found, site)
        if len(_repeats) < _PLAN_CACHE_LIMIT:
            _repeats[key] = [Intervention(f.rule.code, f.rule.slug, f.before, f.after, f.why,
                                          f.rule.fix, site, f.strategy, "fixed")
                             for f in found]
        return applied
    for intervention in again:
        record(intervention)
    return True


# --- torch.amp.autocast.__init__: AMP503, AMP505 --------------------------------

def _autocast_plan(signature, defaults, args, kwargs):
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return _CLEAN  # the user's own mistake: torch says it
    values = dict(defaults)
    values.update(bound.arguments)
    found, fixed = _run(amp_rules.AUTOCAST_CHECKS, values, _state["autocast_call"])
    if not found:
        return _CLEAN
    return found, {name: fixed[name] for name in signature.parameters}


# The signature of torch.amp.autocast.__init__ since torch 1.10. Where it
# matches, the wrapper takes the same parameters: Python binds them, and the
# cache key is the four values.
AUTOCAST_PARAMS = (("device_type", inspect.Parameter.empty), ("dtype", None),
                   ("enabled", True), ("cache_enabled", None))


def _make_autocast_init(init):
    signature = _signature_without_self(init)
    defaults = _defaults(signature)
    if tuple((p.name, p.default) for p in signature.parameters.values()) != AUTOCAST_PARAMS:
        return _make_generic_autocast_init(init, signature, defaults)

    @functools.wraps(init)
    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        new_kwargs = None
        try:
            key = (device_type, dtype, enabled, cache_enabled, CONFIG.disabled, facts._override)
            try:
                plan = _autocast_plans.get(key)
            except TypeError:  # an unhashable argument: decide without the cache
                plan = key = None
            if plan is None:
                plan = _autocast_plan(signature, defaults, (device_type, dtype, enabled,
                                                            cache_enabled), {})
                if key is not None and len(_autocast_plans) < _PLAN_CACHE_LIMIT:
                    _autocast_plans[key] = plan
            new_kwargs = _planned_kwargs(plan, self)
        except engine.UnsafeCallError:  # inline, not decide_or: this runs every step
            raise
        except Exception as exc:
            internal_error("autocast.__init__", exc)
        if new_kwargs is None:
            return init(self, device_type, dtype, enabled, cache_enabled)
        return init(self, **new_kwargs)

    return __init__


def _planned_kwargs(plan, instance):
    """The keyword arguments a plan says to build autocast with, or None: unchanged."""
    if plan is not _CLEAN and _settle(plan[0], _call_site(instance)):
        return plan[1]
    return None


def _make_generic_autocast_init(init, signature, defaults):
    """The same for a torch whose autocast takes other parameters."""

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        new_kwargs = engine.decide_or(None, "autocast.__init__", lambda: _planned_kwargs(
            _autocast_plan(signature, defaults, args, kwargs), self))
        if new_kwargs is None:
            return init(self, *args, **kwargs)
        return init(self, **new_kwargs)

    return __init__


# --- deprecated torch.cuda.amp.autocast / torch.cpu.amp.autocast: AMP501 ---------

def _route_decision(call, instance=None):
    """True to route ``call`` quietly; False to call the deprecated original."""
    key = (call.api, CONFIG.disabled, facts._override)
    found = _state["route_findings"].get(key)
    if found is None:
        found = _state["route_findings"][key] = _run(
            (amp_rules.deprecated_autocast_api,), {}, call)[0]
    return _settle(found, _call_site(instance)) if found else False


def _patch_deprecated_autocast(legacy, call, base):
    deprecated_new = legacy.__dict__["__new__"]
    deprecated_new_func = getattr(deprecated_new, "__func__", deprecated_new)
    base_new = base.__new__

    # wraps: inspect.signature(legacy) must still read (enabled, dtype,
    # cache_enabled); torch.compile binds autocast arguments with it.
    @functools.wraps(deprecated_new_func)
    def __new__(cls, *args, **kwargs):
        if cls is legacy:  # the original warns only for the class itself
            quiet = engine.decide_or(False, "%s.__new__" % call.api, _route_decision, call)
            if not quiet:
                return deprecated_new_func(cls, *args, **kwargs)
        return base_new(cls)

    __new__.__dict__.pop("__deprecated__", None)
    replace(legacy, "__new__", staticmethod(__new__))

    deprecated_hook = legacy.__dict__.get("__init_subclass__")
    if deprecated_hook is None:
        return
    deprecated_func = getattr(deprecated_hook, "__func__", deprecated_hook)
    inner = getattr(deprecated_func, "__wrapped__", None)

    @functools.wraps(deprecated_func)
    def __init_subclass__(cls, **kwargs):
        quiet = engine.decide_or(False, "%s.__init_subclass__" % call.api, _route_decision,
                                 call)
        if not quiet:
            return deprecated_func(cls, **kwargs)
        if inner is not None and not isinstance(inner, type(object.__init_subclass__)):
            return inner(cls, **kwargs)
        return super(legacy, cls).__init_subclass__(**kwargs)

    __init_subclass__.__dict__.pop("__deprecated__", None)
    replace(legacy, "__init_subclass__", classmethod(__init_subclass__))


def _patch_custom_decorators(torch, module, call_of):
    """torch.cuda.amp.custom_fwd/custom_bwd -> torch.amp's, device_type="cuda"."""
    modern_fwd, modern_bwd = torch.amp.custom_fwd, torch.amp.custom_bwd
    legacy_fwd, legacy_bwd = module.custom_fwd, module.custom_bwd

    @functools.wraps(legacy_fwd)
    def custom_fwd(fwd=None, *, cast_inputs=None):
        if _quiet_route(call_of("custom_fwd")):
            return modern_fwd(fwd, device_type="cuda", cast_inputs=cast_inputs)
        return legacy_fwd(fwd, cast_inputs=cast_inputs)

    @functools.wraps(legacy_bwd)
    def custom_bwd(bwd):
        if _quiet_route(call_of("custom_bwd")):
            return modern_bwd(bwd, device_type="cuda")
        return legacy_bwd(bwd)

    for fn in (custom_fwd, custom_bwd):
        fn.__dict__.pop("__deprecated__", None)
    return custom_fwd, custom_bwd


def _quiet_route(call):
    try:
        return _route_decision(call)
    except engine.UnsafeCallError:
        raise
    except Exception as exc:
        internal_error(call.api, exc)
        return False


# --- GradScaler: AMP502, AMP503, AMP504 ------------------------------------------

SCALER_PARAMS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")


def _scaler_plan(instance, call, signature, defaults, args, kwargs):
    """(device or None, scaler keyword arguments) to build with, or None."""
    device = None
    takes_device = "device" in signature.parameters
    if not takes_device:
        # torch.cuda.amp.GradScaler("cuda") or (device="cuda"): new code, old class.
        if "device" in kwargs:
            kwargs = dict(kwargs)
            device = kwargs.pop("device")
        elif args and (isinstance(args[0], str) or type(args[0]).__name__ == "device"):
            device, args = args[0], args[1:]
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None  # the user's own mistake: torch says it
    values = dict(defaults)
    values.update(bound.arguments)
    if not takes_device:
        values["device"] = device
    found, fixed = _run(amp_rules.SCALER_CHECKS, values, call)
    if not found or not engine.settle(found, _call_site(instance)):
        return None
    params = {name: fixed[name] for name in signature.parameters if name != "device"}
    return device_type(fixed["device"]) or call.device or "cuda", params


def _scaler_wrapper(call, signature, build):
    """A GradScaler.__init__ wrapper: plan (failing open), then
    ``build(wrapped, instance, device, params)`` where a plan was made."""
    defaults = _defaults(signature)

    def wrapper(wrapped, instance, args, kwargs):
        plan = engine.decide_or(None, "%s.__init__" % call.api, _scaler_plan, instance, call,
                                signature, defaults, args, kwargs)
        if plan is None:
            return wrapped(*args, **kwargs)
        return build(wrapped, instance, *plan)

    return wrapper


def _legacy_scaler_wrapper(call, signature, route_init):
    """For torch.cuda.amp.GradScaler.__init__ (and the CPU one)."""

    def build(wrapped, instance, device, params):
        if route_init is not None:
            return route_init(instance, device, **params)
        return wrapped(**params)

    return _scaler_wrapper(call, signature, build)


def _modern_scaler_wrapper(call, signature):
    """For torch.amp.GradScaler.__init__: AMP503 only."""
    return _scaler_wrapper(call, signature,
                           lambda wrapped, instance, device, params: wrapped(device, **params))


# --- AMP506: the modern names on a torch that lacks them -------------------------

def _missing(name):
    return AttributeError("module 'torch.amp' has no attribute '%s'" % name)


def _provided_grad_scaler(legacy, legacy_init):
    """torch.amp.GradScaler for a torch that predates it: the CUDA one, by device."""
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
            found, fixed = _run(amp_rules.SCALER_CHECKS, dict(params, device=device), call)
            if not engine.settle(found, _call_site(self)):
                raise _missing("GradScaler")  # warn mode: as without autosafe_torch
            legacy_init(self, **{name: fixed[name] for name in params})

    GradScaler.__module__ = "torch.amp"
    GradScaler.__qualname__ = "GradScaler"
    return GradScaler


def _provided_autocast(torch):
    import wrapt

    call = AmpCall("torch.amp.autocast", route="torch.autocast", provided=True)

    def wrapper(wrapped, instance, args, kwargs):
        found = _run((amp_rules.provided_amp_api,), {}, call)[0]
        if not engine.settle(found, _call_site()):
            raise _missing("autocast")
        return wrapped(*args, **kwargs)

    return wrapt.FunctionWrapper(torch.autocast, wrapper)


# --- helpers ---------------------------------------------------------------------

def _signature_without_self(init):
    signature = inspect.signature(init)
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def _defaults(signature):
    return {p.name: p.default for p in signature.parameters.values()
            if p.default is not inspect.Parameter.empty}


def _is_deprecated(obj):
    return getattr(obj, "__deprecated__", None) is not None


def _subclass(cls, base):
    return isinstance(cls, type) and isinstance(base, type) and issubclass(cls, base) \
        and cls is not base


# --- patch -------------------------------------------------------------------

def patch(torch):
    amp = torch.amp
    autocast_cls = amp.autocast_mode.autocast
    init = autocast_cls.__dict__["__init__"]
    _state["caps"] = TorchAmpCaps(autocast_cls, init)
    _state["autocast_call"] = AmpCall("torch.autocast")
    _state["route_findings"] = {}
    replace(autocast_cls, "__init__", _make_autocast_init(init))

    # AMP501: the deprecated autocast classes and decorators.
    for area in ("cuda", "cpu"):
        module = getattr(getattr(torch, area, None), "amp", None)
        legacy = getattr(module, "autocast", None)
        if _subclass(legacy, autocast_cls) and _is_deprecated(legacy) \
                and "__new__" in legacy.__dict__:
            api = "torch.%s.amp.autocast" % area
            _patch_deprecated_autocast(
                legacy, AmpCall(api, device=area, takes_device=False,
                                route="torch.amp.autocast(%r)" % area), autocast_cls)
    cuda_amp = getattr(getattr(torch, "cuda", None), "amp", None)
    if cuda_amp is not None and hasattr(amp, "custom_fwd") and hasattr(amp, "custom_bwd") \
            and _is_deprecated(getattr(cuda_amp, "custom_fwd", None)):
        def call_of(name):
            return AmpCall("torch.cuda.amp.%s" % name, device="cuda", takes_device=False,
                           route="torch.amp.%s(device_type='cuda')" % name)
        fwd, bwd = _patch_custom_decorators(torch, cuda_amp, call_of)
        for owner in (cuda_amp, getattr(cuda_amp, "autocast_mode", None)):
            if owner is not None and hasattr(owner, "custom_fwd"):
                replace(owner, "custom_fwd", fwd)
                replace(owner, "custom_bwd", bwd)

    # AMP502-AMP504: GradScaler.
    modern = getattr(amp, "GradScaler", None)
    if not (isinstance(modern, type) and "device" in
            _signature_without_self(modern.__init__).parameters):
        modern = None
    if modern is not None:
        wrap(modern, "__init__", _modern_scaler_wrapper(
            AmpCall("torch.amp.GradScaler"), _signature_without_self(modern.__init__)))
    cuda_scaler = None
    for area in ("cuda", "cpu"):
        module = getattr(getattr(torch, area, None), "amp", None)
        legacy = getattr(module, "GradScaler", None)
        if not isinstance(legacy, type) or legacy is modern:
            continue
        signature = _signature_without_self(legacy.__dict__.get("__init__", legacy.__init__))
        if "device" in signature.parameters:
            continue
        route = modern if _subclass(legacy, modern) else None
        call = AmpCall("torch.%s.amp.GradScaler" % area, device=area, takes_device=False,
                       route="torch.amp.GradScaler" if route else None)
        route_init = original(modern, "__init__") if route else None
        wrap(legacy, "__init__", _legacy_scaler_wrapper(call, signature, route_init))
        if area == "cuda":
            cuda_scaler = legacy

    # AMP506: new code on old torch.
    if modern is None and cuda_scaler is not None and not hasattr(amp, "GradScaler"):
        provided = _provided_grad_scaler(cuda_scaler, original(cuda_scaler, "__init__"))
        replace(amp, "GradScaler", provided)
        if not hasattr(torch, "GradScaler"):
            replace(torch, "GradScaler", provided)
    if not hasattr(amp, "autocast") and hasattr(torch, "autocast"):
        replace(amp, "autocast", _provided_autocast(torch))


def unpatch():
    _autocast_plans.clear()
    _repeats.clear()
    _sites.clear()
    _state.clear()
