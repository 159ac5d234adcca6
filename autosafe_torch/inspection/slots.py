"""An instance's ``__slots__`` (every class along the MRO, private names
mangled) and ``__dict__``, read the one way, never asking the instance, by the
walker, the inventory, the digests and the code reads; imports nothing of ours."""

_slots_of = {}


def slot_names(cls):
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
    """``obj.__dict__`` (a dict), or None."""
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except Exception:
        return None
    return attrs if type(attrs) is dict else None


def attributes(obj, limit=None):
    """``[(name, value)]``: an instance's ``__dict__`` (its first ``limit``),
    then the ``__slots__`` that are set."""
    found = list((instance_dict(obj) or {}).items())[:limit]
    for name in slot_names(type(obj)):
        try:
            found.append((name, object.__getattribute__(obj, name)))
        except AttributeError:
            continue
    return found
