"""What the AMP wrappers share: their state, running the checks, signatures
(binding a call: ``patches.bind``, as the DataLoader's patch does)."""

from ... import engine, facts
from ...rules import Context
from .. import bind, defaults_of, signature_without_self  # noqa: F401 (the wrappers' names)

_CLEAN = "clean"      # cached plan: call the original unchanged
_PLAN_CACHE_LIMIT = 4096
state = {}            # caps, the autocast call, cached route findings (patch() fills it)


def run(hook, args, call):
    """The enabled checks at ``hook`` for ``call``: (findings tuple, arguments)."""
    found, fixed = engine.run_checks(hook, args, Context(facts.current(), caps=state["caps"],
                                                         call=call))
    return tuple(found), fixed


def is_deprecated(obj):
    return getattr(obj, "__deprecated__", None) is not None


def is_subclass(cls, base):
    return isinstance(cls, type) and isinstance(base, type) and issubclass(cls, base) \
        and cls is not base
