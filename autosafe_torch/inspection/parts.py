"""The loader's parts: what a worker gets of the loader, and so what every
check and remedy about workers looks at. One definition for all of them."""

PARTS = ("dataset", "collate_fn", "worker_init_fn")


def parts_of(source):
    """``{part: value}`` of a DataLoader (its attributes) or of a mapping of
    its arguments (the checks' ``args``)."""
    if isinstance(source, dict):
        return {name: source[name] for name in PARTS}
    return {name: getattr(source, name) for name in PARTS}
