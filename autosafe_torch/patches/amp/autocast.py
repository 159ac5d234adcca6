"""``torch.amp.autocast.__init__`` (AMP503, AMP505) and the deprecated autocast
names (AMP501). autocast is built on every training step, so its ``__init__``
wrapper is a plain function with one dict lookup on the common path: the
decision is cached per argument tuple, the call site looked up only when
there is something to record.
"""

import functools
import inspect

from ... import engine, facts
from ...callsite import cached_call_site
from ...config import CONFIG
from ...report import internal_error
from .. import Signature, bind, replace
from .common import _CLEAN, _PLAN_CACHE_LIMIT, run, state

# (autocast's args, disabled, facts override) -> _CLEAN or (findings, kwargs);
# (a deprecated API's name, disabled, facts override) -> its routing findings
_autocast_plans = {}


def _autocast_plan(signature, args, kwargs):
    bound = bind(signature, args, kwargs)
    if bound is None:
        return _CLEAN
    found, fixed = run("autocast", bound[1], state["autocast_call"])
    if not found:
        return _CLEAN
    return found, {name: fixed[name] for name in signature.parameters}


# The signature of torch.amp.autocast.__init__ since torch 1.10. Where it
# matches, the wrapper takes the same parameters: Python binds them, and the
# cache key is the four values.
AUTOCAST_PARAMS = (("device_type", inspect.Parameter.empty), ("dtype", None),
                   ("enabled", True), ("cache_enabled", None))


def make_init(init):
    signature = Signature(init)
    if tuple((p.name, p.default) for p in signature.parameters.values()) != AUTOCAST_PARAMS:
        @functools.wraps(init)
        def generic_init(self, *args, **kwargs):  # a torch whose autocast takes other parameters
            new_kwargs = engine.fail_open(None, "autocast.__init__", lambda: _planned_kwargs(
                _autocast_plan(signature, args, kwargs), self))
            if new_kwargs is None:
                return init(self, *args, **kwargs)
            return init(self, **new_kwargs)

        return generic_init

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
                plan = _autocast_plan(signature, (device_type, dtype, enabled, cache_enabled),
                                      {})
                if key is not None and len(_autocast_plans) < _PLAN_CACHE_LIMIT:
                    _autocast_plans[key] = plan
            new_kwargs = _planned_kwargs(plan, self)
        except engine.UnsafeCallError:  # inline, not fail_open: this runs every step
            raise
        except Exception as exc:
            internal_error("autocast.__init__", exc)
        if new_kwargs is None:
            return init(self, device_type, dtype, enabled, cache_enabled)
        return init(self, **new_kwargs)

    return __init__


def _planned_kwargs(plan, instance):
    """The keyword arguments to build autocast with, or None: unchanged."""
    if plan is not _CLEAN and engine.settle_repeated(plan[0], cached_call_site(instance)):
        return plan[1]
    return None


def _route_decision(call):
    """True to route ``call`` quietly; False to call the deprecated original."""
    key = (call.api, CONFIG.disabled, facts._override)
    found = _autocast_plans.get(key)
    if found is None:
        found = _autocast_plans[key] = run("amp.legacy", {}, call)[0]
    return engine.settle_repeated(found, cached_call_site(None)) if found else False


def routed(call, where, deprecated, quiet):
    """``deprecated``'s stand-in: ``quiet`` where the route is decided quiet, else
    ``deprecated`` itself (it warns); failing open to ``deprecated``."""

    @functools.wraps(deprecated)
    def route(*args, **kwargs):
        quiet_now = engine.fail_open(False, call.api + where, _route_decision, call)
        return (quiet if quiet_now else deprecated)(*args, **kwargs)

    route.__dict__.pop("__deprecated__", None)
    return route


def patch_deprecated(legacy, call, base):
    deprecated_new = legacy.__dict__["__new__"]
    deprecated_new_func = getattr(deprecated_new, "__func__", deprecated_new)
    base_new = base.__new__

    # wraps: inspect.signature(legacy) must still read (enabled, dtype,
    # cache_enabled); torch.compile binds autocast arguments with it.
    @functools.wraps(deprecated_new_func)
    def __new__(cls, *args, **kwargs):
        if cls is legacy:  # the original warns only for the class itself
            try:  # inline, not fail_open: this runs every step
                quiet = _route_decision(call)
            except engine.UnsafeCallError:
                raise
            except Exception as exc:
                internal_error("%s.__new__" % call.api, exc)
                quiet = False
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

    def quiet_hook(cls, **kwargs):
        if inner is not None and not isinstance(inner, type(object.__init_subclass__)):
            return inner(cls, **kwargs)
        return super(legacy, cls).__init_subclass__(**kwargs)

    replace(legacy, "__init_subclass__",
            classmethod(routed(call, ".__init_subclass__", deprecated_func, quiet_hook)))


def patch_deprecated_init(legacy, call):
    """Where the deprecation marks ``legacy.__init__`` (torch 2.4-2.8): quiet,
    the undecorated ``__init__`` runs (it calls torch.amp's with the device)."""
    deprecated_init = legacy.__dict__["__init__"]
    inner = getattr(deprecated_init, "__wrapped__", None)
    if inner is not None:
        replace(legacy, "__init__", routed(call, ".__init__", deprecated_init, inner))
