"""The loader's parts: what a worker gets of the loader, and so what every
check and remedy about workers looks at. One definition for all of them."""

from . import holdings, objwalk

PARTS = ("dataset", "collate_fn", "worker_init_fn")


def parts_of(source):
    """``{part: value}`` of a DataLoader (its attributes) or of a mapping of
    its arguments (the checks' ``args``)."""
    if isinstance(source, dict):
        return {name: source[name] for name in PARTS}
    return {name: getattr(source, name) for name in PARTS}


def held_in_parts(parts, wanted):
    """``(path, obj)`` for each object the loader's parts (a mapping) hold for
    which ``wanted(obj)``, once each, as the walk finds them."""
    seen = set()
    for name in PARTS:
        if parts[name] is None:
            continue
        for here, obj, _edge in objwalk.walk(parts[name], name, stop=holdings.stop_at):
            if id(obj) not in seen and wanted(obj):
                seen.add(id(obj))
                yield here, obj
