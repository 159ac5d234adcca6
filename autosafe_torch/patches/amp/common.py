"""What the AMP wrappers share: their state, running the checks, signatures."""

import inspect

from ... import engine, facts
from ...rules import Context

_CLEAN = "clean"      # cached plan: call the original unchanged
_PLAN_CACHE_LIMIT = 4096
state = {}            # caps, the autocast call, cached route findings (patch() fills it)


def bind(signature, defaults, args, kwargs):
    """Every parameter's value for this call (defaults filled in), or None when
    the call does not bind: the user's own mistake, which torch reports."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None
    values = dict(defaults)
    values.update(bound.arguments)
    return values


def run(hook, args, call):
    """The enabled checks at ``hook`` for ``call``: (findings tuple, arguments)."""
    found, fixed = engine.run_checks(hook, args, Context(facts.current(), caps=state["caps"],
                                                         call=call))
    return tuple(found), fixed


def signature_without_self(init):
    signature = inspect.signature(init)
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def defaults_of(signature):
    return {p.name: p.default for p in signature.parameters.values()
            if p.default is not inspect.Parameter.empty}


def is_deprecated(obj):
    return getattr(obj, "__deprecated__", None) is not None


def is_subclass(cls, base):
    return isinstance(cls, type) and isinstance(base, type) and issubclass(cls, base) \
        and cls is not base
