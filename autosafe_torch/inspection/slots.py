"""An instance's ``__slots__`` (every class along the MRO, private names
mangled) and ``__dict__``, read the one way: for the walker, the inventory's
reductions and the digests. Imports nothing of ours, so that each can use it."""

_slots_of = {}


def slot_names(cls):
    """Attribute names of every ``__slots__`` along the MRO (mangled), cached."""
    if cls in _slots_of:
        return _slots_of[cls]
    names = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = "_%s%s" % (klass.__name__.lstrip("_"), name)
            if name not in names:
                names.append(name)
    _slots_of[cls] = tuple(names)
    return _slots_of[cls]


def instance_dict(obj):
    """``obj.__dict__`` read without asking ``obj`` (a dict), or None."""
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except Exception:
        return None
    return attrs if type(attrs) is dict else None
