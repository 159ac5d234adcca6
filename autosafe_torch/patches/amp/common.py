"""What the AMP wrappers share: their state, running the checks."""

from ... import engine, facts
from ...rules import AmpContext

_CLEAN = "clean"      # cached plan: call the original unchanged
_PLAN_CACHE_LIMIT = 4096
state = {}            # caps and the autocast call (patch() fills it)


def run(hook, args, call):
    """The enabled checks at ``hook`` for ``call``: (findings tuple, arguments)."""
    found, fixed = engine.run_checks(hook, args, AmpContext(facts.current(), caps=state["caps"],
                                                            call=call))
    return tuple(found), fixed


def is_deprecated(obj):
    return getattr(obj, "__deprecated__", None) is not None


def is_subclass(cls, base):
    return isinstance(cls, type) and isinstance(base, type) and issubclass(cls, base) \
        and cls is not base
