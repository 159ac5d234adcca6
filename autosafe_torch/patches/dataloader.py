"""``DataLoader.__init__``: bind, check, apply, call the original.

Arguments that DataLoader refuses to change after ``__init__`` (and those it
rejects inside ``__init__``) are corrected here, before the original runs.
Subclasses are covered: their ``super().__init__`` lands in this wrapper.
"""

import inspect

from .. import engine, facts
from ..callsite import user_call_site
from ..report import internal_error
from . import wrap

# Rule modules checked at construction, in this order; each has CHECKS.
# Later checks see the arguments as the earlier ones left them.
INIT_CHECK_MODULES = (
    "autosafe_torch.rules.loader_args",
    "autosafe_torch.rules.accel",
    "autosafe_torch.rules.resources",
    "autosafe_torch.rules.cv2",
)

_signature = {}


def init_checks():
    if "checks" not in _signature:
        import importlib

        _signature["checks"] = tuple(
            check for name in INIT_CHECK_MODULES
            for check in importlib.import_module(name).CHECKS)
    return _signature["checks"]


def patch(torch):
    from torch.utils.data import DataLoader

    sig = inspect.signature(DataLoader.__init__)
    params = list(sig.parameters.values())[1:]  # without self
    _signature["sig"] = sig.replace(parameters=params)
    _signature["defaults"] = {p.name: p.default for p in params
                              if p.default is not inspect.Parameter.empty}
    wrap(DataLoader, "__init__", _init_wrapper)


def _init_wrapper(wrapped, instance, args, kwargs):
    try:
        bound = _signature["sig"].bind(*args, **kwargs)
    except TypeError:
        return wrapped(*args, **kwargs)  # the user's own mistake: torch says it
    try:
        new = _decide(bound, instance)
    except engine.UnsafeCallError:
        raise
    except Exception as exc:
        internal_error("DataLoader.__init__", exc)
        return wrapped(*args, **kwargs)
    if new is None:
        return wrapped(*args, **kwargs)
    return wrapped(*new.args, **new.kwargs)


def _decide(bound, instance):
    """The bound arguments to call with, or None to call unchanged."""
    values = dict(_signature["defaults"])
    values.update(bound.arguments)
    context = values.get("multiprocessing_context")
    found, fixed = engine.run_checks(init_checks(), values,
                                     facts.current(context), _signature["defaults"])
    if not engine.settle(found, user_call_site(instance) if found else None):
        return None
    for name in {k for f in found for k in f.after}:
        bound.arguments[name] = fixed[name]
    return bound
