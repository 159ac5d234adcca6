"""The registry of patch targets.

Each patch module (one per patched library area, as in dd-trace-py) has
``patch(module)`` and ``unpatch()`` and is applied when its trigger module
is imported. ``wrap`` and ``replace`` remember the original, once;
``revert`` puts every original back.
"""

import contextlib
import importlib
import inspect
import sys

from ..config import CONFIG

# trigger module -> patch modules applied when it is imported
TARGETS = {
    "torch": ("autosafe_torch.patches.dataloader", "autosafe_torch.patches.pinning",
              "autosafe_torch.patches.amp", "autosafe_torch.patches.datasets"),
    "cv2": ("autosafe_torch.patches.cv2",),
}

_originals = {}   # (owner, attribute name) -> original attribute
_applied = set()  # patch module names applied


class Signature:
    """A method's parameters as its callers see them (no ``self``), and their defaults."""

    def __init__(self, method):
        signature = inspect.signature(method)
        self.signature = signature.replace(parameters=list(signature.parameters.values())[1:])
        self.parameters = self.signature.parameters
        self.defaults = {p.name: p.default for p in self.parameters.values()
                         if p.default is not inspect.Parameter.empty}


def bind(signature, args, kwargs):
    """``(inspect.BoundArguments, every parameter's value, defaults filled in)``
    of this call to ``signature`` (a ``Signature``); None when it does not bind:
    the user's own mistake, which torch reports."""
    try:
        bound = signature.signature.bind(*args, **kwargs)
    except TypeError:
        return None
    return bound, {**signature.defaults, **bound.arguments}


def wrap(owner, name, wrapper):
    import wrapt

    if (owner, name) not in _originals:
        _originals[owner, name] = owner.__dict__[name] if isinstance(owner, type) \
            else getattr(owner, name)
        wrapt.wrap_function_wrapper(owner, name, wrapper)


def wrapped(owner, name):
    return (owner, name) in _originals


def unwrap(owner, name):
    """Put back what ``wrap`` or ``replace`` replaced at ``owner.name`` (one patch
    undone alone; ``revert`` undoes them all)."""
    if (owner, name) not in _originals:
        return
    value = _originals.pop((owner, name))
    if value is _MISSING:
        with contextlib.suppress(AttributeError):
            delattr(owner, name)
    else:
        setattr(owner, name, value)


def replace(owner, name, value):
    """Replace ``owner.name`` outright (for names that must stay classes)."""
    key = (owner, name)
    if key not in _originals:
        _originals[key] = owner.__dict__.get(name, _MISSING) if isinstance(owner, type) \
            else getattr(owner, name, _MISSING)
    setattr(owner, name, value)


_MISSING = object()


def original(owner, name):
    return _originals.get((owner, name), getattr(owner, name, None))


_deferred = []  # (trigger, module) met while torch_private was loading


def apply_for(trigger, module):
    """Apply every patch module registered for ``trigger``; each fails alone.
    While ``torch_private`` loads (its ``import torch`` runs this), the patches,
    which read it, wait for its end (``apply_deferred``)."""
    loading = sys.modules.get("autosafe_torch.torch_private")
    if loading is not None and not getattr(loading, "LOADED", False):
        _deferred.append((trigger, module))
        return
    from ..report import internal_error
    from ..rules import load_all

    try:
        CONFIG.validate_disabled(load_all())
    except Exception as exc:
        internal_error("loading the rules", exc)
    for name in TARGETS.get(trigger, ()):
        if name in _applied:
            continue
        try:
            importlib.import_module(name).patch(module)
            _applied.add(name)
        except Exception as exc:
            internal_error("patching %s" % name, exc)


def apply_deferred():
    """What waited for ``torch_private`` to load (``apply_for``)."""
    while _deferred:
        apply_for(*_deferred.pop(0))


def revert():
    """Undo every patch (``autosafe_torch.deactivate()``)."""
    for owner, name in list(_originals):
        unwrap(owner, name)
    for name in list(_applied):
        with contextlib.suppress(Exception):  # AttributeError: a patch with nothing to undo
            importlib.import_module(name).unpatch()
    _applied.clear()
